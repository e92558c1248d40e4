"""Configuration of `serve`: frozen dataclasses and load_config(). Raw dicts stop here.

Precedence: command-line flags, then environment variables (prefix SGLANG_OOM_EXPORTER_), then the YAML
file, then the defaults, which work without any file. Every problem is collected into one ConfigError
listing each key path (and the file's line where there is one), so `--check-config` shows them all. A new
setting is a row in the settings table and a field of the model; the modules are in docs/architecture.md.
"""
