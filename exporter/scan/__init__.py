"""The offline `scan`: one input through one pipeline, or (`--jobs N`) files in worker processes and big files
cut into ranges joined exactly, then the text or JSON report. Each name is imported from the module that defines
it; the modules are in docs/architecture.md, the one code map.
"""
