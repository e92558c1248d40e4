"""Command line: argparse, logging setup and exit codes. The only reader of argv and the environment.

Exit codes: 0 success; 1 `scan --fail-on-oom` found a fatal event, `serve --check-config` found
problems, or `render --check` found stale files; 2 usage errors, unreadable input, a bad catalog or a bad
configuration at startup, with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from . import __version__
from .catalog import CatalogError, load_catalog
from .scan.report import format_text
from .scan.run import load_server_args, scan_paths
from .scan.serial import InputError
from .sources.fsname import shown

EXIT_OK, EXIT_OOM, EXIT_USAGE = 0, 1, 2


def sample_path(name: str = "sample.log") -> str:
    """A bundled sample: the synthetic log (several SGLang eras, TP=2, every fatal kind, retractions), or
    the server-info JSON that goes with it."""
    from importlib import resources

    return str(resources.files("sglang_oom_exporter").joinpath(f"samples/{name}"))


SERVE_HELP = "follow SGLang logs live and export OOM counters on /metrics"
RENDER_HELP = "write the alert rules, runbooks, dashboards and chart copies from the catalog"


def build_parser(only_scan: bool = False) -> argparse.ArgumentParser:
    """The argument parser, also the source of --help. With only_scan (the command is scan), serve and render
    get no arguments: a scan then never imports the configuration code that serve's help quotes."""
    parser = argparse.ArgumentParser(
        prog="sglang-oom-exporter",
        description=(
            "Find SGLang KV-cache out-of-memory events in logs, count each exactly once, and say how to fix them."
        ),
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    scan = sub.add_parser(
        "scan",
        help="analyse existing log files offline and print the OOM events with their fixes",
        description=(
            "Read whole log files (plain, .gz, CRI container logs, docker json-file, docker-compose output; "
            "'-' is stdin) and print every OOM event with its numbers and remediation, then totals per kind."
        ),
    )
    scan.add_argument("paths", nargs="*", metavar="PATH", help="log files to read; '-' reads stdin")
    scan.add_argument("--format", choices=("text", "json"), default="text", help="output format (default: text)")
    scan.add_argument("--fail-on-oom", action="store_true", help="exit 1 when any fatal OOM event was found")
    scan.add_argument("--sample", action="store_true",
                      help="scan the bundled synthetic sample log (with its bundled server args)")  # fmt: skip
    scan.add_argument("--catalog", metavar="FILE", help="use this catalog instead of the built-in one")
    scan.add_argument(
        "--prefix-regex",
        action="append",
        default=[],
        metavar="REGEX",
        help="an extra log-prefix pattern (named groups ts and ranks) for custom SGLang logging configs; repeatable",
    )
    scan.add_argument("--no-prefilter", action="store_true", help="parse every line (slower; for debugging)")
    scan.add_argument(
        "--jobs",
        type=_jobs,
        default=_cpus(),
        metavar="N",
        help="processes to scan in (default: the number of CPUs): N-1 workers and this one, which takes the "
        "last 1/N of the bytes. Files go to different processes and a big plain file is cut into ranges, with "
        "the same result as --jobs 1, which reads in this process, as does any N when the files hold under "
        "16 MiB in all. gzip files are each read whole by one process; stdin is read in this process",
    )
    scan.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="a progress line on stderr (bytes of total, rate, files, events, time left); default: "
                      "on when stderr is a terminal, unless --format json goes to a pipe")  # fmt: skip
    scan.add_argument("--server-args", metavar="FILE",
                      help="JSON from SGLang's /server_info (or /get_server_info): fills the flag values the log's "
                      "own banner and capacity lines do not give")  # fmt: skip
    if only_scan:
        sub.add_parser("serve", help=SERVE_HELP)
        sub.add_parser("render", help=RENDER_HELP)
    else:
        _serve_parser(sub)
        _render_parser(sub)
    return parser


def _render_parser(sub: Any) -> None:
    render = sub.add_parser(
        "render",
        help=RENDER_HELP,
        description=(
            "Render every generated file of the alert pack from the catalog into OUT_DIR (default: the "
            "current directory, meant to be the repository root). With --check nothing is written: exit 1 and "
            "name each file that differs from a fresh render."
        ),
    )
    render.add_argument("out_dir", nargs="?", default=".", metavar="OUT_DIR", help="output root (default: .)")
    render.add_argument("--check", action="store_true", help="exit 1 if any generated file is stale; write nothing")
    render.add_argument("--catalog", metavar="FILE", help="use this catalog instead of the built-in one")
    render.add_argument("--overrides", metavar="FILE",
                        help="merge this small YAML onto the catalog: job_selector, cluster_label, and alerts: "
                        "{<AlertName>: {threshold, for, ...}} (docs/multi-cluster.md)")  # fmt: skip
    render.add_argument("--runbook-base-url", metavar="URL",
                        help="where the runbook pages live (default: docs/runbooks on the main branch)")  # fmt: skip
    render.add_argument("--runbook-url-template", metavar="TEMPLATE",
                        help="a runbook page's URL from {base} (the base URL) and {page} (the alert's name in "
                             "lower case, or README for the index); default: the repository's Markdown pages, "
                             "{base}/{page}.md; a wiki may want {base}/{page}")  # fmt: skip
    render.add_argument("--grafana-url", metavar="URL", default="",
                        help="Grafana base URL: alerts then carry a dashboard_url (default: none)")  # fmt: skip


def _serve_parser(sub: Any) -> None:
    """serve's flags, one per row of the settings table that has one, with its help and default from there."""
    from .config.settings import DEFAULT_LISTEN, ENV_PREFIX, SETTINGS

    serve = sub.add_parser(
        "serve",
        help=SERVE_HELP,
        description=(
            "Follow log files, globs, Kubernetes pod logs or stdin, count every OOM exactly once (across "
            "rotations and restarts, with --state-dir), and serve /metrics, /healthz, /events and an HTML page "
            f"on {DEFAULT_LISTEN} by default. Flags override {ENV_PREFIX}* environment variables, which "
            "override the --config file. SIGTERM/SIGINT save the state and exit 0; SIGHUP reloads the config. "
            "Every setting: docs/configuration-reference.md."
        ),
    )
    for setting in SETTINGS:
        if setting.name == "paths":
            serve.add_argument("paths", nargs="*", metavar=setting.metavar, help=setting.help)
            continue
        flag = setting.flag_name
        if flag is None:
            continue
        options: dict[str, Any] = {"help": f"{setting.help} (default: {setting.shown_default})"}
        if setting.kind == "bool":
            options.update(action="store_const", const=True, default=None)
        elif setting.kind == "choice":
            options.update(choices=setting.choices)
        else:
            options.update(metavar=setting.metavar)
            if setting.kind == "structured" and setting.name in ("prefix_regex", "targets"):
                options.update(action="append")
        serve.add_argument(flag, **options)
        if setting.name == "config":
            serve.add_argument("--check-config", action="store_true",
                               help="validate the configuration and exit 0 or 1")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and of `python -m sglang_oom_exporter`."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only_scan=argv[:1] == ["scan"])
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    if args.command == "serve":
        from .serve import serve

        return serve(args)
    if args.command == "render":
        return _render(args)
    return _scan(args)


def _cpus() -> int:
    """CPUs this process may run on (a container's cpuset), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, not {text!r}")
    return value


def _show_progress(args: argparse.Namespace) -> bool:
    """--progress or --no-progress when given; else a terminal on stderr, unless JSON goes to a pipe."""
    if args.progress is not None:
        return bool(args.progress)
    if not _isatty(sys.stderr):
        return False
    return args.format != "json" or _isatty(sys.stdout)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed (tests, embedding)
        return False


def _fail(message: str) -> int:
    print(f"sglang-oom-exporter: {shown(message)}", file=sys.stderr)  # a file name in it as the page shows it
    return EXIT_USAGE


def _render(args: argparse.Namespace) -> int:
    from .project import PROJECT_URL
    from .render import checkout_files, is_checkout, render_all, stale_files, write_files
    from .render.options import DEFAULT_RUNBOOK_URL_TEMPLATE, RenderOptions, runbook_base_for, runbook_template_problem
    from .render.projecturl import checkout_project_url

    template = args.runbook_url_template or DEFAULT_RUNBOOK_URL_TEMPLATE
    problem = runbook_template_problem(template)
    if problem is not None:
        return _fail(f"bad --runbook-url-template: {problem}")
    try:
        if args.overrides:
            from .render.overrides import load_with_overrides

            catalog = load_with_overrides(args.overrides, args.catalog)
        else:
            catalog = load_catalog(args.catalog)
    except CatalogError as exc:
        return _fail(("bad overrides or catalog:\n" if args.overrides else "bad catalog:\n") + str(exc))
    # In the checkout, pyproject.toml's URL wins over the installed copy (render rewrites that copy too).
    project_url = (is_checkout(catalog, args.out_dir) and checkout_project_url(args.out_dir)) or PROJECT_URL
    options = RenderOptions(
        runbook_base_url=(args.runbook_base_url or runbook_base_for(project_url)).rstrip("/"),
        grafana_url=args.grafana_url.rstrip("/"),
        project_url=project_url,
        runbook_url_template=template,
    )
    files = render_all(catalog, options) | checkout_files(catalog, args.out_dir)
    if args.check:
        stale = stale_files(files, args.out_dir)
        for rel in stale:
            print(f"stale: {rel} (run: sglang-oom-exporter render)", file=sys.stderr)
        print(f"render --check: {len(files) - len(stale)} of {len(files)} generated files up to date")
        return EXIT_OOM if stale else EXIT_OK
    try:
        changed = write_files(files, args.out_dir)
    except OSError as exc:
        return _fail(f"render: cannot write under {args.out_dir}: {exc}")
    print(f"render: {len(files)} files, {len(changed)} changed")
    for rel in changed:
        print(f"  wrote {rel}")
    return EXIT_OK


def _scan(args: argparse.Namespace) -> int:
    paths = list(args.paths)
    if args.sample:
        paths.insert(0, sample_path())
        args.server_args = args.server_args or sample_path("server_info.json")
    if not paths:
        return _fail("scan: give at least one PATH, '-' for stdin, or --sample")
    try:
        catalog = load_catalog(args.catalog)
    except CatalogError as exc:
        return _fail("bad catalog:\n" + str(exc))
    for rx in args.prefix_regex:
        import regex

        try:
            regex.compile(rx)
        except regex.error as exc:
            return _fail(f"--prefix-regex {rx!r}: {exc}")
    progress = None
    if _show_progress(args):
        from .progress import Progress

        progress = Progress(sys.stderr)
    try:
        server_args = load_server_args(args.server_args) if args.server_args else None
        result = scan_paths(catalog, paths, prefilter=not args.no_prefilter, extra_prefixes=args.prefix_regex,
                            server_args=server_args, jobs=args.jobs, progress=progress)  # fmt: skip
    except (InputError, KeyboardInterrupt) as exc:
        if progress is not None and progress.draws:
            sys.stderr.write("\n")  # the error (or Ctrl-C's traceback) starts its own line
        if isinstance(exc, KeyboardInterrupt):
            raise
        return _fail(str(exc))
    if progress is not None:
        progress.finish(len(result.events))
    if args.format == "json":
        # Compact on purpose: the C encoder is ten times faster than indent= on a big scan; pipe to jq.
        sys.stdout.write(json.dumps(result.to_json()) + "\n")
    else:
        sys.stdout.write(format_text(result, {sample_path(): "sample.log"} if args.sample else None))
    for path, why in result.errors:
        _fail(f"cannot scan {path} (the other inputs are reported): {why}")
    if result.errors:
        return EXIT_USAGE
    if args.fail_on_oom and result.fatal_count():
        return EXIT_OOM
    return EXIT_OK
