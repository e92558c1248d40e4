"""The pure detection pipeline, one module per stage.

bytes -> reader (prefilter) -> decode (CRI/docker/compose wrappers) -> prefix -> assemble (blocks,
tracebacks) -> match (catalog) -> dedupe (block + traceback, ranks of one tick) -> OomEvent.
`pipeline` wires the stages for one source; `model` holds the frozen values that flow between them.
No I/O, no threads, no clocks of its own: `scan` and the daemon both drive it.
"""
