"""The live daemon behind `serve`: source set, loop, state keeper, event sink and targets, wired in app.py.

loop.py starts the daemon's threads (serve binds the HTTP edge first). The daemon feeds bytes from `sources`
into `detect` pipelines, and events through sink.py into `metrics` and the store that `web` serves; `scan`
uses the same sink.
"""
