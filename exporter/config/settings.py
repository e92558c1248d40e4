"""Configuration, the settings table: the one home of each setting's key, type, default, bounds, environment
variable, command-line flag and help sentence.

Everything else is derived from SETTINGS: the Builder's checks and the known keys (keys.py), the Config
defaults (model.py), the environment variables load_config reads, serve's flags and their help (cli.py), and
the generated reference page docs/configuration-reference.md (render/settingsdoc.py). A new scalar setting is
one Setting here and one field in model.py (whose default comes from here); the tests read the table too.

The structured settings (paths, sources, kubernetes, prefix_regex, targets, and the config file itself) have a
row for their name, environment variable, flag and help; their shape is read by yamlfile.py and load.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .values import DAY, HOUR, LEVELS, MS, format_duration

ENV_PREFIX = "SGLANG_OOM_EXPORTER_"
DEFAULT_PORT = 9877
DEFAULT_LISTEN = f":{DEFAULT_PORT}"

Kind = Literal["duration", "bool", "int", "choice", "listen", "text", "structured"]


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting. `env` and `flag`: True derives the name (NAME in upper case after ENV_PREFIX; --name with
    dashes), False means there is none, a string names it. low/high bound a duration (seconds) or an int."""

    name: str  # the config file's key, and the Config field of a scalar setting
    kind: Kind
    default: Any
    help: str  # one sentence, lower case, no final stop: --help and the reference page both quote it
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    env: bool | str = True
    flag: bool | str = True
    file: bool = True  # a key of the YAML file
    metavar: str = ""
    shown: str = ""  # how the default reads where the value itself says nothing (None, a structure)
    note: str = ""  # more for the reference page than --help has room for
    values: str = ""  # what a structured setting takes, in words
    reload: bool | None = True  # SIGHUP applies a change; False: kept until a restart (app.py RESTART_ONLY)

    @property
    def env_var(self) -> str | None:
        """The full environment variable, or None."""
        if self.env is False:
            return None
        return ENV_PREFIX + (self.name.upper() if self.env is True else self.env)

    @property
    def flag_name(self) -> str | None:
        """serve's option (--poll-interval), or None."""
        if self.flag is False:
            return None
        return "--" + self.name.replace("_", "-") if self.flag is True else self.flag

    @property
    def dest(self) -> str | None:
        """The argparse attribute of the flag, which is also the key of load_config's `flags` mapping."""
        flag = self.flag_name
        return None if flag is None else flag.removeprefix("--").replace("-", "_")

    @property
    def shown_default(self) -> str:
        """The default as a user writes it: 1s, 10s, 2.5s, :9877, off, info, 200."""
        if self.shown:
            return self.shown
        if self.kind == "duration":
            return format_duration(float(self.default))
        if self.kind == "bool":
            return "on" if self.default else "off"
        return str(self.default)

    @property
    def bounds(self) -> str:
        """The allowed values in words ("" when any value of the type goes)."""
        if self.values:
            return self.values
        if self.kind == "duration" and self.low is not None and self.high is not None:
            return f"{format_duration(self.low)} to {format_duration(self.high)}"
        if self.kind == "int" and self.low is not None and self.high is not None:
            return f"{self.low:g} to {self.high:g}"
        if self.choices:
            return ", ".join(self.choices)
        if self.kind == "bool":
            return "true/false, yes/no, on/off, 1/0"
        if self.kind == "listen":
            return "HOST:PORT, [V6]:PORT or :PORT"
        return ""

    @property
    def scalar(self) -> bool:
        """A single value checked by the Builder (the structured ones have their own readers)."""
        return self.kind != "structured"


def _duration(name: str, default: float, low: float, high: float, help: str, **kw: Any) -> Setting:
    return Setting(name, "duration", default, help, low=low, high=high, metavar="DURATION", **kw)


# In the order serve's --help lists its flags.
SETTINGS: tuple[Setting, ...] = (
    Setting("paths", "structured", (), "log files or globs to follow; '-' reads stdin and passes it through to "
            "stdout", flag=False, metavar="PATH|GLOB|-", shown="none",
            values="a list of paths and globs",
            note="the command line's arguments; the variable is comma-separated"),
    Setting("sources", "structured", (), "named log sources, followed like paths",
            env=False, flag=False, shown="none", values="a list of {path, name}"),
    Setting("listen", "listen", DEFAULT_LISTEN, "HTTP listen address", metavar="HOST:PORT", reload=False),
    Setting("state_dir", "text", None, "keep positions, counters and dedupe memory here", metavar="DIR",
            shown="none, nothing is kept across restarts", reload=False),
    Setting("from_beginning", "bool", False,
            "on a first start without state, read existing files from their start, not their end"),
    Setting("kubernetes", "structured", None, "Kubernetes node mode: follow ROOT/<ns>_<pod>_<uid>/<container>/<n>.log "
            "(e.g. /var/log/pods)", env="KUBERNETES_LOGS", flag="--kubernetes-logs", metavar="ROOT", shown="off",
            values="a mapping with logs_root",
            note="the flag and the variable give logs_root; the file's mapping also takes namespace, pod, "
            "container (filter regexes), discover_targets and events (docs/kubernetes.md). A reload applies "
            "the filters; switching the mode on or off, discover_targets and events need a restart"),
    Setting("config", "structured", None, "YAML config file (unknown keys are errors)", env="CONFIG",
            file=False, metavar="FILE", shown="none", values="a path", reload=None),
    Setting("force_polling", "bool", False, "poll instead of inotify (network and overlay filesystems)",
            reload=False),
    _duration("poll_interval", 1.0, MS, HOUR, "loop tick, and the polling interval with --force-polling"),
    _duration("sweep_interval", 10.0, MS, DAY, "stat every followed file this often even without a file event"),
    _duration("discover_interval", 5.0, MS, DAY, "look for new files (globs, the Kubernetes log root) this often",
              flag=False),
    _duration("state_interval", 5.0, MS, DAY, "save the state (with --state-dir) this often", flag=False),
    _duration("traceback_wait", 2.5, MS, HOUR,
              "how long the generic 0.5.4+ OOM text waits for the traceback that names its phase (and a PD decode "
              "server's SWA eviction line for the assertion that may follow it)"),
    _duration("evidence_wait", 60.0, MS, HOUR,
              "how long a generic CUDA OOM of a source not yet shown to be SGLang waits for SGLang evidence after it",
              note="it also waits at most 1000 lines (docs/recognition.md); one that gets none is a foreign event"),
    _duration("source_retention", 3600.0, 1.0, 365 * DAY,
              "drop the series of a source whose log is gone after this long"),
    Setting("recent_events", "int", 200, "how many recent events /events and the HTML page keep", low=1,
            high=100_000, env=False, flag=False, reload=False),
    Setting("web_config", "text", None, "TLS and basic auth, exporter-toolkit web-config format", metavar="FILE",
            shown="none, plain HTTP without auth", reload=False),
    Setting("log_level", "choice", "info", "log verbosity", choices=LEVELS),
    Setting("catalog", "text", None, "use this catalog instead of the built-in one", metavar="FILE",
            shown="the built-in one"),
    Setting("prefix_regex", "structured", (), "extra log-prefix pattern (named groups ts and ranks); repeatable",
            env=False, metavar="REGEX", shown="none", values="a list of regexes"),
    Setting("targets", "structured", (), "SGLang base URL to scrape (/metrics, /server_info), e.g. "
            "http://127.0.0.1:30000; repeatable. One URL serves every log source; map several with 'targets:' "
            "in the config file", env="SGLANG_URL", flag="--sglang-url", metavar="URL", shown="none",
            values="a list of {url, source}",
            note="the file takes a list of {url, source}; the variable is comma-separated"),
    _duration("scrape_interval", 15.0, MS, DAY, "how often to scrape each SGLang"),
    _duration("scrape_timeout", 5.0, MS, HOUR, "give up on one scrape after this"),
    Setting("otlp_listen", "listen", None, "receive log records over OTLP/HTTP (POST /v1/logs) on this address; "
            "needs --state-dir", metavar="HOST:PORT", shown="off", reload=False,
            note="records are spooled in the state directory before the answer (docs/otlp.md); the web config's "
            "TLS and basic auth apply to it too"),
    Setting("otlp_max_request_kib", "int", 8192, "refuse (413) an OTLP request body larger than this many KiB, "
            "before or after gzip", low=1, high=100_000, metavar="KIB", reload=False),
    Setting("otlp_bearer_token_file", "text", None, "also require 'Authorization: Bearer <token>' with the "
            "token in this file on OTLP requests", metavar="FILE", shown="none", reload=False),
    Setting("otlp_spool_source_mib", "int", 256, "cap the OTLP spool of one source at this many MiB on disk; "
            "a batch past it while its lines are unread gets 503", low=1, high=100_000, metavar="MIB",
            reload=False, note="a source's log is rotated at a quarter of it and read segments are deleted "
            "(docs/otlp.md); serve refuses a cap below two requests of --otlp-max-request-kib"),
    Setting("otlp_spool_total_mib", "int", 1536, "cap the OTLP spool of all sources at this many MiB on disk; "
            "a batch past it gets 503", low=1, high=100_000, metavar="MIB", reload=False,
            note="size the state volume above it (the chart's receiver.stateVolume)"),
    _duration("otlp_spool_retention", 3600.0, 1.0, 365 * DAY, "remove a received source's spool once it got "
              "no record for this long and was read to its end", reload=False),
    Setting("otlp_spool_max_sources", "int", 4096, "spool at most this many OTLP sources (container runs, files, "
            "services); a batch naming a new one past it gets 503", low=1, high=100_000, metavar="N",
            reload=False, note="each takes about 16 KiB of disk blocks, 4 inodes and 15 KiB of memory; a source is "
            "removed once idle for --otlp-spool-retention and read to its end (docs/otlp.md)"),
    Setting("otlp_spool_dedupe_windows", "int", 16, "hold at most this many OTLP sources' full dedupe windows "
            "(65,536 record identities, about 5.3 MiB each) in memory", low=1, high=100_000, metavar="N",
            reload=False, note="the windows of the sources that received least recently leave memory and are "
            "read back from disk when they next receive (docs/otlp.md); a retry is still a duplicate"),
)  # fmt: skip
# Bounds of durations inside a structured setting, by their key path.
NESTED_DURATION_BOUNDS = {"discover_targets.interval": (1.0, DAY)}

BY_NAME = {s.name: s for s in SETTINGS}
SCALARS = tuple(s for s in SETTINGS if s.scalar)


def default(name: str) -> Any:
    """The default of a scalar setting, for model.py's field."""
    return BY_NAME[name].default
