"""The HTTP edge: /metrics, /healthz, /events, the HTML page and the exporter-toolkit style web config."""
