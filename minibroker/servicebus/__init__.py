"""Azure Service Bus, as its SDKs meet it on the wire (issue 17): the pure parts of the ``servicebus`` personality.

``addresses``: entity addresses as the SDKs send them (full URIs), subscriptions and sub-queues.
``cbs``: the claims-based-security node ``$cbs`` (put-token answered 202; 401 for a token no configured SAS key
signed).
``declarations``: entities declared before start (the emulator's ``Config.json``, ``[servicebus]``).
``messages``: what Service Bus adds to a delivered message (lock tokens, annotations), batch messages split,
and dead-lettered copies.

Nothing here imports the broker core: the core calls these functions at its seams, only for namespaces whose
personality is ``servicebus``.
"""
