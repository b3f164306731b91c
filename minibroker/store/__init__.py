"""The journal (``store.journal``), its records (``store.records``) and the durable state (``store.state``)."""

RECOVER_MODES = ("strict", "skip-corrupt")
"""``--recover`` / ``[data] recover``: on a corrupt journal, refuse to start or skip the corrupt records. Here, not
in ``store.journal``, so that the command line and the config check it without loading the journal (issue 19)."""
