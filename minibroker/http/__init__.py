"""The HTTP side of the broker: the metrics page (``metrics``)."""
