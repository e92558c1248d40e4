"""Shared fixtures and suite-wide settings: a per-test log directory, an autouse guard that fails tests leaking
threads, a directory the xdist workers share, bytecode kept between runs, and the long tests scheduled first.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

# Threads get this long to finish after a test: a stopped observer's threads exit asynchronously.
_THREAD_GRACE_SECONDS = 2.0
# The harness's fixtures, for every test module (tests/support: in-process apps closed after each test, the daemon,
# the HTTP server, the fake API, the CLI).
pytest_plugins = [
    "tests.support.app", "tests.support.daemon", "tests.support.server", "tests.support.kubeapi", "tests.support.cli",
]  # fmt: skip
_ROOT = Path(__file__).resolve().parent.parent

if sys.dont_write_bytecode and not sys.pycache_prefix:
    # With PYTHONDONTWRITEBYTECODE every run recompiles (and re-rewrites the asserts of) every test module in
    # each xdist worker, and every daemon a test starts recompiles the package: about 3 s of CPU per worker
    # and 0.1 s per daemon. Keep the bytecode in pytest's own cache directory instead, still out of the tree.
    sys.pycache_prefix = str(_ROOT / ".pytest_cache" / "pycache")
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = sys.pycache_prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


# The slowest tests of `make test`'s selection, by measurement (`pytest -n 2 --durations=0 -m "not e2e and not slow
# and not lint"`, 2026-12-08, summed over parameters): these 40 functions took 581 of its 976 test-seconds. They
# are `slow` (pytest_collection_modifyitems marks them): `make all`, CI's run, still runs them, and `make test`, the
# edit loop, leaves them out. Remeasure and move a test here when the loop grows past its figure in CONTRIBUTING.
MEASURED_SLOW = frozenset({
    "tests/test_alerts.py::test_the_loader_names_each_bad_alert_field",
    "tests/test_architecture.py::test_every_name_is_imported_from_the_module_that_defines_it",
    "tests/test_architecture.py::test_every_part_imports_only_lower_layers",
    "tests/test_architecture.py::test_no_import_cycle_between_modules",
    "tests/test_architecture.py::test_no_import_cycle_between_packages",
    "tests/test_architecture.py::test_no_module_reads_another_modules_private_names",
    "tests/test_architecture.py::test_test_modules_share_their_harness_only_through_tests_support",
    "tests/test_catalog.py::test_loader_rejects_a_joins_name_that_is_not_snake_case",
    "tests/test_catalog.py::test_loader_rejects_pattern_frames_that_are_not_a_list_of_frames",
    "tests/test_catalog.py::test_no_module_uses_a_phase_that_shares_a_kind_id_as_that_kind",
    "tests/test_catalog.py::test_phase_kinds_map_the_kv_phases_and_may_map_only_the_pd_prealloc_group",
    "tests/test_config_edges.py::test_check_config_refuses_an_otlp_spool_cap_that_cannot_hold_two_requests",
    "tests/test_fsname.py::test_a_received_name_reads_as_its_identity_and_gives_it_back",
    "tests/test_fuzz_pipeline.py::test_fuzz_pipeline",
    "tests/test_golden.py::test_golden",
    "tests/test_nul_runs.py::test_a_128_mib_nul_run_is_read_in_bulk_and_the_oom_behind_it_counted",
    "tests/test_otlp_edge.py::test_a_request_of_more_records_than_the_cap_gets_413_before_they_are_made",
    "tests/test_otlp_edge.py::test_a_resource_of_100000_attributes_is_read_once_not_per_record",
    "tests/test_otlp_spool_faults.py::test_a_disk_that_fills_and_frees_again_loses_and_doubles_nothing",
    "tests/test_otlp_spool_faults.py::test_a_write_error_at_every_write_and_fsync_of_a_batch_loses_and_doubles_nothing",
    "tests/test_otlp_spool_memory.py::test_a_window_takes_a_batch_at_once_as_it_takes_its_identities_one_by_one",
    "tests/test_otlp_spool_memory.py::test_the_bulk_ids_reader_agrees_with_recoverys_row_rules",
    "tests/test_otlp_spool_memory.py::test_the_windows_in_memory_stop_growing_at_the_budget_whatever_the_number_of_sources",
    "tests/test_otlp_spool_scale.py::test_thousands_of_services_list_the_shared_directory_once_per_pass_not_once_per_source",
    "tests/test_properties.py::test_a_dying_scheduler_gives_exactly_one_event_whatever_its_exception_says",
    "tests/test_otlp_spool_scale.py::test_thousands_of_sources_retired_at_once_cost_a_pass_not_one_per_source",
    "tests/test_overrides.py::test_moving_rendered_text_to_another_cluster_label_equals_rendering_with_it",
    "tests/test_overrides.py::test_overrides_change_the_job_selector_cluster_label_and_the_named_numbers_only",
    "tests/test_reliability_edges24.py::test_check_config_passes_a_path_a_log_root_or_stdin",
    "tests/test_reliability_edges24.py::test_check_config_rejects_what_a_reload_rejects",
    "tests/test_render.py::test_check_names_each_stale_or_missing_file_and_writes_nothing",
    "tests/test_render.py::test_the_committed_files_are_a_fresh_render",
    "tests/test_scale_files.py::test_a_restart_keeps_idle_files_unbuilt_and_counts_once",
    "tests/test_scan_lookback.py::test_every_golden_log_gives_the_same_json_with_four_look_back_lines_and_without_prefilter",
    "tests/test_scan_parallel.py::test_a_split_that_ignores_quiet_points_gets_it_wrong",
    "tests/test_scan_parallel.py::test_cli_jobs_with_stdin_between_files_keeps_input_order",
    "tests/test_scan_progress.py::test_no_progress_on_a_pipe_and_the_output_is_the_same",
    "tests/test_scan_progress.py::test_the_flags_override_what_the_terminal_decides",
    "tests/test_state_fields.py::test_any_value_anywhere_in_the_state_file_never_stops_a_start",
    "tests/test_state_fields.py::test_any_value_in_any_field_of_a_restored_event_never_fails_a_page",
})  # fmt: skip


@pytest.hookimpl(optionalhook=True)  # xdist's hook: `-p no:xdist` must still run the suite
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: three workers per CPU. Much of the suite's time is spent waiting on the processes it drives
    (daemons, a real Prometheus and Alertmanager, helm): with one worker per CPU the CPUs sat idle for half
    the run, with two still for a fifth (2 CPUs: 59 s with 4 workers, 53 s with 6, the same CPU seconds).
    Tests of a rate run their daemon at a higher priority where allowed (tests/support/daemon.py, Daemon.nice)."""
    return 3 * len(os.sched_getaffinity(0))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the slow marks it adds must count
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Long tests first on every worker. xdist's worksteal scheduler (README's test command) first hands
    worker i the i-th contiguous slice of the collected items, and only later moves work between them; so
    the items, sorted long first (slow, then e2e, then the longer timeout first; stable), are dealt out
    round-robin into one slice per worker. The order is the same on every worker, as xdist requires."""

    for item in items:
        if item.nodeid.split("[", 1)[0] in MEASURED_SLOW:
            item.add_marker(pytest.mark.slow)

    def key(item: pytest.Item) -> tuple[bool, bool, float]:
        timeout = item.get_closest_marker("timeout")
        return (
            item.get_closest_marker("slow") is None,
            item.get_closest_marker("e2e") is None,
            -float(timeout.args[0] if timeout and timeout.args else 0),
        )

    items.sort(key=key)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        # The live SGLang tests run one server at a time (a file lock in tests/support/live_sglang.py): dealt
        # out, they would hold a worker each while they wait for it; all in the first slice, they run in turn.
        live = [item for item in items if item.get_closest_marker("live_sglang")]
        rest = [item for item in items if not item.get_closest_marker("live_sglang")]
        items[:] = live + [item for w in range(workers) for item in rest[w::workers]]


@pytest.fixture(scope="session", autouse=True)
def _shared_dir(tmp_path_factory):
    """Give helpers.once_per_run the directory the xdist workers of this run share (their basetemps' parent)."""
    from tests.support import helpers

    if os.environ.get("PYTEST_XDIST_WORKER"):
        helpers.SHARED_DIR = tmp_path_factory.getbasetemp().parent / "shared"


@pytest.fixture
def tls(tmp_path):
    """(cert, key, token file) for a fake Kubernetes API server on 127.0.0.1; the cert is its own CA."""
    from tests.support.helpers import openssl_cert

    cert, key = openssl_cert(tmp_path, "apiserver")
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    return cert, key, token


@pytest.fixture
def log_dir(tmp_path):
    """A fresh directory for the log files of one test."""
    directory = tmp_path / "logs"
    directory.mkdir()
    return directory


# What marks a test `e2e` (make e2e; make test leaves it out): it starts one of these programs, or the daemon.
E2E_PROGRAMS = frozenset({
    "promtool", "prometheus", "amtool", "alertmanager", "prometheus-alertmanager", "podman", "chromium",
    "chromium-browser", "helm", "mtail", "mmdebstrap",
})  # fmt: skip


def e2e_program(argv: Any) -> str | None:
    """The program in argv that makes a test end-to-end (one of E2E_PROGRAMS, or `serve`: the daemon), else None.
    A command line (shell=True) is judged by its first word."""
    text = isinstance(argv, (str, bytes))
    args = shlex.split(os.fsdecode(argv)) if text else [os.fsdecode(a) for a in argv]
    if not args:
        return None
    name = os.path.basename(args[0])
    if name in E2E_PROGRAMS:
        return name
    command = (
        args[1:2] if name == "sglang-oom-exporter" else args[3:4] if args[1:3] == ["-m", "sglang_oom_exporter"] else []
    )
    quick = {"--check-config", "--help", "-h"}.intersection(args)  # serve that checks or explains, and exits
    return "the daemon (serve)" if command == ["serve"] and not quick else None


_RUNNING: list[pytest.Item] = []  # the test whose setup, call or teardown is running (fixtures of any scope)
_popen_init = subprocess.Popen.__init__


def _checked_popen_init(self: subprocess.Popen[Any], args: Any, *more: Any, **kwargs: Any) -> None:
    """Popen, failing an unmarked test that starts a program of E2E_PROGRAMS or the daemon: make test, the
    seconds-long loop, leaves e2e tests out, and one unmarked would make it slow or need machine packages."""
    program = e2e_program(args)
    if program is not None and _RUNNING and _RUNNING[-1].get_closest_marker("e2e") is None:
        pytest.fail(f"{_RUNNING[-1].nodeid} starts {program}: mark it @pytest.mark.e2e", pytrace=False)
    _popen_init(self, args, *more, **kwargs)


subprocess.Popen.__init__ = _checked_popen_init  # type: ignore[method-assign]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Note the running test for _checked_popen_init: a module or session fixture starts under the first test
    that asks for it, so that test must be marked."""
    _RUNNING.append(item)
    try:
        return (yield)
    finally:
        _RUNNING.pop()


@pytest.fixture(autouse=True)
def _no_leaked_threads():
    """Fail the test if it leaves threads running (watchdog's conftest does the same)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + _THREAD_GRACE_SECONDS
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    while leaked and time.monotonic() < deadline:
        leaked[0].join(deadline - time.monotonic())
        leaked = [t for t in leaked if t.is_alive()]
    assert not leaked, f"test leaked threads: {leaked}"


@pytest.fixture(scope="session")
def podman(tmp_path_factory, _shared_dir):
    """podman confined to this test run (tests/support/podman.py); skips with the reason where it cannot run."""
    from tests.support import helpers
    from tests.support.podman import Podman, skip_reason

    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    root = helpers.SHARED_DIR / "podman" if helpers.SHARED_DIR else tmp_path_factory.mktemp("podman")
    return Podman(root)


@pytest.fixture(scope="session")
def image(podman) -> str:
    """The project's image built from the Dockerfile, once per test run; its name."""
    from tests.support.podman import built_image

    built = built_image(podman)
    print(f"\nimage built: seconds per step {built['seconds']}")
    return str(built["image"])
