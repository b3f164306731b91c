"""The HTTP management API and its web console."""
