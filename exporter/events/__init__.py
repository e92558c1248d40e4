"""Where every OomEvent goes after dedupe, for `scan` and `serve` alike: enriched, counted, stored, redacted.

It imports only the detection, catalog and advice layers, so `scan`, `daemon` and `web` can all use it without
importing each other. Its modules are in docs/architecture.md, the one code map.
"""
