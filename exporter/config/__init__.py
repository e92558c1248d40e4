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

from __future__ import annotations

from .keys import bounded_duration, unknown_env
from .load import ConfigError, load_config, nothing_to_follow
from .model import DEFAULT_LISTEN, DEFAULT_PORT, Config, DiscoverTargetsConfig, EventsConfig, KubernetesConfig
from .settings import ENV_PREFIX, SETTINGS, Setting
from .values import parse_duration, parse_listen

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_PORT",
    "ENV_PREFIX",
    "SETTINGS",
    "Config",
    "ConfigError",
    "DiscoverTargetsConfig",
    "EventsConfig",
    "KubernetesConfig",
    "Setting",
    "bounded_duration",
    "load_config",
    "nothing_to_follow",
    "parse_duration",
    "parse_listen",
    "unknown_env",
]
