"""Where every OomEvent goes after dedupe, for `scan` and `serve` alike: sink.py (enrich, count, store, the
JSON form), store.py (the recent events and health that `web` serves and the daemon saves), redact.py (what
an excerpt may not show). It imports only the detection, catalog and advice layers, so `scan`, `daemon` and
`web` can all use it without importing each other.
"""
