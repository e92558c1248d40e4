"""The live daemon behind `serve`: the source set, the loop, the state keeper and the targets, wired by App.

The loop starts the daemon's threads (serve binds the HTTP edge first). The daemon feeds bytes from `sources`
into `detect` pipelines, and events through `events` (the sink, shared with `scan`) into `metrics` and the
store that `web` serves. Its modules are in docs/architecture.md, the one code map.
"""
