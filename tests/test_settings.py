"""The settings table (config/settings.py): each scalar setting is accepted from the file, the environment and
its flag within its bounds, `serve --help` states each default, and the generated reference lists every row.

The table drives the parametrised tests; the literal tables below say what it must hold, written by hand, so
that a wrong row (a default, a bound, a variable's name) fails here instead of being copied everywhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_oom_exporter.cli import build_parser, main
from sglang_oom_exporter.config.keys import unknown_env
from sglang_oom_exporter.config.load import ConfigError, load_config
from sglang_oom_exporter.config.model import Config
from sglang_oom_exporter.config.settings import SETTINGS, Setting
from sglang_oom_exporter.render.settingsdoc import PATH, page
from sglang_oom_exporter.serve import config_flags

ROOT = Path(__file__).resolve().parent.parent
SCALARS = [s for s in SETTINGS if s.scalar]

# name: (default, the environment variable or None, the flag or None), as the README and docs promise them.
EXPECTED = {
    "listen": (":9877", "SGLANG_OOM_EXPORTER_LISTEN", "--listen"),
    "state_dir": (None, "SGLANG_OOM_EXPORTER_STATE_DIR", "--state-dir"),
    "from_beginning": (False, "SGLANG_OOM_EXPORTER_FROM_BEGINNING", "--from-beginning"),
    "force_polling": (False, "SGLANG_OOM_EXPORTER_FORCE_POLLING", "--force-polling"),
    "poll_interval": (1.0, "SGLANG_OOM_EXPORTER_POLL_INTERVAL", "--poll-interval"),
    "sweep_interval": (10.0, "SGLANG_OOM_EXPORTER_SWEEP_INTERVAL", "--sweep-interval"),
    "discover_interval": (5.0, "SGLANG_OOM_EXPORTER_DISCOVER_INTERVAL", None),
    "state_interval": (5.0, "SGLANG_OOM_EXPORTER_STATE_INTERVAL", None),
    "traceback_wait": (2.5, "SGLANG_OOM_EXPORTER_TRACEBACK_WAIT", "--traceback-wait"),
    "evidence_wait": (60.0, "SGLANG_OOM_EXPORTER_EVIDENCE_WAIT", "--evidence-wait"),
    "source_retention": (3600.0, "SGLANG_OOM_EXPORTER_SOURCE_RETENTION", "--source-retention"),
    "recent_events": (200, None, None),
    "web_config": (None, "SGLANG_OOM_EXPORTER_WEB_CONFIG", "--web-config"),
    "log_level": ("info", "SGLANG_OOM_EXPORTER_LOG_LEVEL", "--log-level"),
    "catalog": (None, "SGLANG_OOM_EXPORTER_CATALOG", "--catalog"),
    "scrape_interval": (15.0, "SGLANG_OOM_EXPORTER_SCRAPE_INTERVAL", "--scrape-interval"),
    "scrape_timeout": (5.0, "SGLANG_OOM_EXPORTER_SCRAPE_TIMEOUT", "--scrape-timeout"),
    "otlp_listen": (None, "SGLANG_OOM_EXPORTER_OTLP_LISTEN", "--otlp-listen"),
    "otlp_max_request_kib": (8192, "SGLANG_OOM_EXPORTER_OTLP_MAX_REQUEST_KIB", "--otlp-max-request-kib"),
    "otlp_bearer_token_file": (None, "SGLANG_OOM_EXPORTER_OTLP_BEARER_TOKEN_FILE", "--otlp-bearer-token-file"),
    "otlp_spool_source_mib": (256, "SGLANG_OOM_EXPORTER_OTLP_SPOOL_SOURCE_MIB", "--otlp-spool-source-mib"),
    "otlp_spool_total_mib": (1536, "SGLANG_OOM_EXPORTER_OTLP_SPOOL_TOTAL_MIB", "--otlp-spool-total-mib"),
    "otlp_spool_retention": (3600.0, "SGLANG_OOM_EXPORTER_OTLP_SPOOL_RETENTION", "--otlp-spool-retention"),
    "otlp_spool_max_sources": (4096, "SGLANG_OOM_EXPORTER_OTLP_SPOOL_MAX_SOURCES", "--otlp-spool-max-sources"),
    "otlp_spool_dedupe_windows": (16, "SGLANG_OOM_EXPORTER_OTLP_SPOOL_DEDUPE_WINDOWS", "--otlp-spool-dedupe-windows"),
}
# The bounds a duration is refused outside of, as --check-config words them.
BOUNDS = {
    "poll_interval": ("1ms", "1h"), "sweep_interval": ("1ms", "1d"), "discover_interval": ("1ms", "1d"),
    "state_interval": ("1ms", "1d"), "traceback_wait": ("1ms", "1h"), "evidence_wait": ("1ms", "1h"),
    "source_retention": ("1s", "365d"), "scrape_interval": ("1ms", "1d"), "scrape_timeout": ("1ms", "1h"),
    "otlp_spool_retention": ("1s", "365d"),
}  # fmt: skip
# (a value to give, the value the Config then holds) per kind, none of them a default.
GIVEN = {"duration": ("3s", 3.0), "bool": ("true", True), "int": ("7", 7), "choice": ("DEBUG", "debug"),
         "listen": ("127.0.0.1:1234", "127.0.0.1:1234"), "text": ("/some/where", "/some/where")}  # fmt: skip
# A value each kind refuses, and the words of the refusal.
REFUSED = {"bool": ("maybe", "'maybe' is not a boolean"), "int": ("0", "must be between 1 and 100000"),
           "choice": ("loud", "must be one of debug, info, warning, error"),
           "listen": ("nowhere", "'nowhere' is not HOST:PORT (e.g. :9877, 127.0.0.1:9877 or [::1]:9877)")}  # fmt: skip
# Every variable load_config reads: the scalars' and the structured settings'.
KNOWN_ENV = sorted(
    {env for _, env, _ in EXPECTED.values() if env}
    | {f"SGLANG_OOM_EXPORTER_{n}" for n in ("CONFIG", "PATHS", "SGLANG_URL", "KUBERNETES_LOGS")}
)


def _ids(setting: Setting) -> str:
    return setting.name


def test_the_table_holds_what_the_docs_promise():
    assert {s.name: (s.default, s.env_var, s.flag_name) for s in SCALARS} == EXPECTED
    assert {s.name: (s.shown_default, s.bounds.split(" to ")) for s in SCALARS if s.kind == "duration"} == {
        "poll_interval": ("1s", ["1ms", "1h"]), "sweep_interval": ("10s", ["1ms", "1d"]),
        "discover_interval": ("5s", ["1ms", "1d"]), "state_interval": ("5s", ["1ms", "1d"]),
        "traceback_wait": ("2.5s", ["1ms", "1h"]), "evidence_wait": ("1m", ["1ms", "1h"]),
        "source_retention": ("1h", ["1s", "365d"]),
        "scrape_interval": ("15s", ["1ms", "1d"]), "scrape_timeout": ("5s", ["1ms", "1h"]),
        "otlp_spool_retention": ("1h", ["1s", "365d"]),
    }  # fmt: skip
    assert [s.name for s in SETTINGS if not s.scalar] == ["paths", "sources", "kubernetes", "config", "prefix_regex",
                                                          "targets"]  # fmt: skip


def test_config_defaults_are_the_tables():
    config = Config()
    assert {name: getattr(config, name) for name in EXPECTED} == {name: d for name, (d, _, _) in EXPECTED.items()}
    assert load_config(env={}, flags={}) == config


def test_unknown_keys_and_variables_are_still_reported(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("poll_intervall: 1s\nconfig: other.yaml\nrecent_events: 5\n")
    with pytest.raises(ConfigError) as err:
        load_config(str(path), env={})
    assert err.value.problems == [f"{path}: config: unknown key", f"{path}: poll_intervall: unknown key"]
    env = {name: "1" for name in KNOWN_ENV} | {"SGLANG_OOM_EXPORTER_RECENT_EVENTS": "5", "HOME": "/root"}
    assert unknown_env(env) == ["SGLANG_OOM_EXPORTER_RECENT_EVENTS"]  # the file's only: no variable reads it


@pytest.mark.parametrize("setting", [s for s in SCALARS if s.file], ids=_ids)
def test_every_scalar_setting_is_read_from_the_file(setting, tmp_path):
    given, held = GIVEN[setting.kind]
    path = tmp_path / "c.yaml"
    path.write_text(f"{setting.name}: '{given}'\n")
    assert getattr(load_config(str(path), env={}), setting.name) == held != setting.default


@pytest.mark.parametrize("setting", [s for s in SCALARS if s.env_var], ids=_ids)
def test_every_scalar_setting_with_a_variable_is_read_from_it(setting):
    given, held = GIVEN[setting.kind]
    assert getattr(load_config(env={str(setting.env_var): given}), setting.name) == held != setting.default


@pytest.mark.parametrize("setting", [s for s in SCALARS if s.flag_name], ids=_ids)
def test_every_scalar_setting_with_a_flag_is_read_from_the_command_line(setting):
    given, held = GIVEN[setting.kind]
    if setting.kind == "choice":
        given = given.lower()  # argparse's choices are exact: --log-level DEBUG is a usage error (exit 2)
    argv = ["serve", str(setting.flag_name)] if setting.kind == "bool" else ["serve", str(setting.flag_name), given]
    args = build_parser().parse_args([*argv, "x.log"])
    config = load_config(env={}, flags=config_flags(args))
    assert getattr(config, setting.name) == held != setting.default
    assert config.paths == ("x.log",)


def _sources(setting: Setting, value: str, tmp_path: Path) -> list[tuple[str, dict[str, object]]]:
    """(where the problem is named, load_config's arguments) for each way the setting can be given."""
    path = tmp_path / "c.yaml"
    path.write_text(f"{setting.name}: '{value}'\n")
    ways: list[tuple[str, dict[str, object]]] = [(f"{path}: {setting.name}", {"path": str(path), "env": {}})]
    if setting.env_var:
        ways.append((setting.env_var, {"env": {setting.env_var: value}}))
    if setting.flag_name:
        ways.append((setting.flag_name, {"env": {}, "flags": {str(setting.dest): value}}))
    return ways


@pytest.mark.parametrize("setting", [s for s in SCALARS if s.kind == "duration"], ids=_ids)
def test_every_duration_is_bounded_wherever_it_comes_from(setting, tmp_path):
    low, high = BOUNDS[setting.name]
    for value in ("0s", "400d"):
        for where, kwargs in _sources(setting, value, tmp_path):
            with pytest.raises(ConfigError) as err:
                load_config(**kwargs)
            assert err.value.problems == [f"{where}: {value!r} must be between {low} and {high}"]
    for value in (low, high):  # the bounds themselves pass
        for _, kwargs in _sources(setting, value, tmp_path):
            assert getattr(load_config(**kwargs), setting.name) == _seconds(value)


def _seconds(text: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(ms|s|h|d)", text).groups()
    return int(number) * {"ms": 0.001, "s": 1.0, "h": 3600.0, "d": 86400.0}[unit]


@pytest.mark.parametrize("setting", [s for s in SCALARS if s.kind in REFUSED], ids=_ids)
def test_every_checked_scalar_refuses_a_bad_value_wherever_it_comes_from(setting, tmp_path):
    value, words = REFUSED[setting.kind]
    for where, kwargs in _sources(setting, value, tmp_path):
        with pytest.raises(ConfigError) as err:
            load_config(**kwargs)
        assert err.value.problems == [f"{where}: {words}"]


def test_serve_help_states_every_default(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one line per option: argparse wraps at the terminal's width
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = capsys.readouterr().out
    # One block per option: its line, and the next when argparse puts a long option's help below it.
    blocks = {b.split()[0]: " ".join(b.split()) for b in re.split(r"\n(?=  -)", text.split("options:")[1]) if b.strip()}
    flagged = [s for s in SETTINGS if s.flag_name]
    assert len(flagged) == 26
    for setting in flagged:
        block = blocks[str(setting.flag_name)]
        assert block.endswith(f"{setting.help} (default: {setting.shown_default})"), block
    for literal in ("--listen HOST:PORT", "HTTP listen address (default: :9877)", "(default: 1s)", "(default: 10s)",
                    "(default: 2.5s)", "(default: 1h)", "(default: 15s)", "(default: 5s)", "(default: info)",
                    "--log-level {debug,info,warning,error}", "--check-config"):  # fmt: skip
        assert literal in text, literal


def test_the_reference_page_has_a_row_per_setting_and_is_committed():
    text = page()
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| file key")]
    assert len(rows) == len(SETTINGS) == 31
    assert (
        "| `poll_interval` | `--poll-interval` | `SGLANG_OOM_EXPORTER_POLL_INTERVAL` | `1s` | 1ms to 1h | applied | "
        "Loop tick, and the polling interval with --force-polling. |"
    ) in rows
    assert "| `recent_events` | — | — | `200` | 1 to 100000 | restart | " in text
    assert "- `kubernetes.discover_targets.interval`: a duration, 1s to 1d." in text
    assert (ROOT / PATH).read_text(encoding="utf-8") == text  # render --check says the same for every file


def test_the_hand_written_synopsis_names_every_flag():
    synopsis = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8").split("```")[1]
    flags = set(re.findall(r"--[a-z-]+", synopsis))
    assert flags == {str(s.flag_name) for s in SETTINGS if s.flag_name} | {"--check-config"}
