"""The live daemon behind `serve`: source set, loop, state keeper and targets, wired in app.py.

loop.py starts the daemon's threads (serve binds the HTTP edge first). The daemon feeds bytes from `sources`
into `detect` pipelines, and events through `events` (the sink, shared with `scan`) into `metrics` and the
store that `web` serves.
"""
