"""Advice: turn an OOM event, the server args and the KV snapshot into concrete flag changes."""
