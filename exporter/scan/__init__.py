"""The offline `scan`: serial.py (one input through one pipeline), parallel.py and join.py (`--jobs N`: files in
worker processes, big files cut into ranges and joined exactly), report.py (the result and its text and JSON),
run.py (scan_paths, which picks serial or parallel). Each name is imported from the module that defines it.
"""
