"""Where records go: the bounded queue and the exporter thread (``outputs``), JSON lines and
OTLP spans (``spans``), OTLP metrics (``otlp_metrics``)."""
