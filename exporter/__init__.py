"""sglang-oom-exporter: SGLang KV-cache OOM events from logs, as Prometheus metrics."""

__version__ = "0.1.0"
