"""Adversarial review probes of issue 12's access and engine items (branch ``i12-rev-access``, on eaa3b13).

Each probe asserts what the README, the issue or the AMQP specification promises, and fails on the reviewed code:
dynamic-node names (item 22), annotations a symbol cannot key (string keys), ``minibroker check`` credentials and
amqps (item 20), handles above handle-max in any frame and frames charged toward max-message-size (items 16, 17),
allowances burned by checks that never ran, iteration counts that tell users apart, the limiter's cost at its
bound (items 3, 19), and pending-handshake eviction of a login under check (item 18).
"""
