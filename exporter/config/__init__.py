"""Configuration of `serve`: frozen dataclasses and load_config(). Raw dicts stop here.

Precedence: command-line flags, then environment variables (prefix SGLANG_OOM_EXPORTER_), then the YAML
file, then the defaults, which work without any file. Every problem is collected into one ConfigError
listing each key path (and the file's line where there is one), so `--check-config` shows them all.

  settings.py  the settings table: each setting's key, type, default, bounds, variable, flag and help
  model.py     the dataclasses (a new setting is a row in the table and a field here)
  keys.py      the known keys and the Builder that checks each value, both derived from the table
  values.py    the value parsers: durations, booleans, listen addresses, URLs, regexes
  yamlfile.py  the file's shape; load.py layers file, environment and flags
"""
