"""The live daemon behind `serve`: the loop, the set of log sources, the state keeper and the event store.

The only place threads start. It feeds bytes from `sources` into `detect` pipelines and events into
`metrics` and the store that `web` serves.
"""
