"""Each engine's Prometheus metric names, one module per engine."""
