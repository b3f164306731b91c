"""Adversarial review of issue 12's durability items (5 journal side, 7-13, and item 1 for journal writes): probes
that fail on i12 as merged (eaa3b13), each naming the promise it breaks. Three pass and stay as regression tests:
test_probe_delivery_count (0xFFFFFFFF journaled and restored), test_probe_names (NUL, non-BMP, long names over
restarts) and test_probe_commit_disk_full (a commit whose record meets a full disk is answered once written)."""
