"""Observability: exporter and plugins host, Prometheus, TSDB reads, hang watchdog, Ray."""
