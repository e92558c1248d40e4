"""Configuration, the layers: load_config() builds the Config from the YAML file, then the environment
(prefix SGLANG_OOM_EXPORTER_), then the command-line flags, each overriding the one before; the defaults
(model.py) work without any of them. Every problem is collected into one ConfigError.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ..errors import ProblemsError
from .keys import ENV_SCALARS, Builder
from .model import Config, KubernetesConfig
from .settings import ENV_PREFIX
from .values import URL


class ConfigError(ProblemsError):
    """Every problem found in the configuration, one per line."""


def load_config(
    path: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """Build the Config from file, environment and flags; ConfigError lists every problem."""
    env = os.environ if env is None else env
    flags = flags or {}
    builder = Builder()
    path = flags.get("config") or env.get(ENV_PREFIX + "CONFIG") or path
    if path:
        from .yamlfile import read_file  # here, not at the top: PyYAML costs about 25 ms of start-up without a file

        read_file(builder, path)
    _from_env(builder, env)
    _from_flags(builder, flags)
    if builder.problems:
        raise ConfigError(builder.problems)
    return Config(**builder.values)


def nothing_to_follow(config: Config, *, stdin: bool) -> str:
    """Why a config would follow nothing ("" when it names a log path, a Kubernetes log root, or stdin is read).

    A SIGHUP reload refuses such a config (an empty or truncated file, an editor mid-save, would otherwise stop
    every source at once), and `--check-config` rejects it for the same reason: one rule for both.
    """
    if config.paths or config.kubernetes is not None or stdin or config.otlp_listen:
        return ""
    return "the configuration names no log path and no Kubernetes log root"


def otlp_problems(config: Config) -> list[str]:
    """What keeps the OTLP receiver's settings from working together (an empty list when off or sound)."""
    if not config.otlp_listen:
        return []
    if not config.state_dir:
        # A 2xx tells the shipper to forget the records: only a spool on disk may say it (docs/otlp.md).
        return ["otlp_listen: needs state_dir (received records are spooled there before the answer)"]
    # A spool cap must hold two of the largest requests: a batch past a cap gets 503 while older lines are
    # unread, so a cap below one request would answer every retry of that batch 503, for ever.
    need = 2 * config.otlp_max_request_kib
    return [
        f"{name}: {mib} MiB cannot hold two requests of --otlp-max-request-kib {config.otlp_max_request_kib} "
        f"(at least {-(-need // 1024)} MiB), so a full batch would be refused with 503 on every retry"
        for name, mib in (
            ("otlp_spool_source_mib", config.otlp_spool_source_mib),
            ("otlp_spool_total_mib", config.otlp_spool_total_mib),
        )
        if mib * 1024 < need
    ]


def _with_logs_root(builder: Builder, root: str) -> None:
    base = builder.values.get("kubernetes")
    builder.values["kubernetes"] = replace(base, logs_root=root) if base else KubernetesConfig(root)


def _from_env(builder: Builder, env: Mapping[str, str]) -> None:
    for setting in ENV_SCALARS:
        name = str(setting.env_var)
        if env.get(name):
            builder.set(name, setting.name, env[name])
    if env.get(ENV_PREFIX + "PATHS"):
        builder.values["paths"] = tuple(p for p in env[ENV_PREFIX + "PATHS"].split(",") if p)
    if env.get(ENV_PREFIX + "SGLANG_URL"):
        builder.values["sglang_urls"] = tuple(u.rstrip("/") for u in env[ENV_PREFIX + "SGLANG_URL"].split(",") if u)
    if env.get(ENV_PREFIX + "KUBERNETES_LOGS"):
        _with_logs_root(builder, env[ENV_PREFIX + "KUBERNETES_LOGS"])


def _from_flags(builder: Builder, flags: Mapping[str, Any]) -> None:
    for key, value in flags.items():
        if value is None or key == "config":
            continue
        if key == "paths":
            if value:
                builder.values["paths"] = tuple(value)
        elif key == "kubernetes_logs":
            _with_logs_root(builder, value)
        elif key == "sglang_url":
            bad = [u for u in value if not URL.match(u)]
            builder.problems.extend(f"--sglang-url: {u!r} is not an http(s) URL" for u in bad)
            if value and not bad:
                builder.values["sglang_urls"] = tuple(u.rstrip("/") for u in value)
        elif key == "prefix_regex":
            for i, rx in enumerate(value):
                builder.check_regex(f"--prefix-regex[{i}]", rx)
            if value:
                builder.values["prefix_regex"] = tuple(value)
        else:
            builder.set(f"--{key.replace('_', '-')}", key, value)
