"""`serve`: build the daemon from the command line and run it until a signal. Edge code: flags, logging,
signals and the HTTP edge are set up here. The composition root, beside cli.py: it wires daemon/ (which
never imports web/) to web/; daemon/loop.py starts and stops every thread.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any, BinaryIO

from .catalog import Catalog, CatalogError, load_catalog
from .config.keys import unknown_env
from .config.load import ConfigError, load_config, nothing_to_follow, otlp_problems
from .config.model import Config
from .config.settings import SETTINGS
from .config.values import parse_listen
from .daemon.app import App
from .daemon.signals import SignalRelay
from .metrics.exposition import PageRegistry
from .sources.fsname import ShownFormatter
from .sources.handles import raise_open_file_limit
from .sources.watch import Waker
from .web.server import ExporterServer
from .web.webconfig import WebConfig, WebConfigError, load_web_config

if TYPE_CHECKING:
    from .web.otlp import OtlpServer

log = logging.getLogger("sglang_oom_exporter")

_FLAG_KEYS = tuple(s.dest for s in SETTINGS if s.dest is not None)
_LOAD_ERRORS = (ConfigError, CatalogError, WebConfigError)


def config_flags(args: argparse.Namespace) -> dict[str, Any]:
    """load_config's `flags` from serve's parsed command line (the flags cli.py made from the settings table)."""
    flags = {key: getattr(args, key, None) for key in _FLAG_KEYS}
    flags["paths"] = list(args.paths)
    return flags


def _load(args: argparse.Namespace) -> tuple[Config, Catalog]:
    config = load_config(flags=config_flags(args))
    # "-" is stdin: read by the stdin pump, never discovered as a file.
    return replace(config, paths=tuple(p for p in config.paths if p != "-")), load_catalog(config.catalog)


def stdio() -> tuple[BinaryIO, BinaryIO]:
    """The process's binary stdin and stdout."""
    return sys.stdin.buffer, sys.stdout.buffer


def serve(args: argparse.Namespace) -> int:
    """Run the daemon; returns the process exit status."""
    try:
        config, catalog = _load(args)
        web = load_web_config(config.web_config) if config.web_config else None
        address = parse_listen(config.listen)
        unknown = unknown_env(os.environ)
        if unknown and args.check_config:
            # A typo would be silently ignored: --check-config fails on it, serve warns and runs.
            raise ConfigError([f"{name}: unknown variable (no setting reads it)" for name in unknown])
        problems = otlp_problems(config)
        if problems:
            raise ConfigError(problems)
        problem = nothing_to_follow(config, stdin="-" in args.paths)
        if problem and args.check_config:
            # What a SIGHUP reload refuses, --check-config rejects (serve itself starts, and /healthz says why).
            raise ConfigError([problem])
    except _LOAD_ERRORS as exc:
        print(f"sglang-oom-exporter: bad configuration:\n{exc}", file=sys.stderr)
        return 1 if args.check_config else 2
    if args.check_config:
        print(f"configuration ok: {len(config.paths)} path(s), kubernetes={'on' if config.kubernetes else 'off'}, "
              f"listen {config.listen}, {len(catalog.kinds)} OOM kinds")  # fmt: skip
        return 0
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(ShownFormatter("%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"))
    logging.basicConfig(level=config.log_level.upper(), handlers=[handler])
    for name in unknown:
        log.warning("unknown variable %s (ignored): no setting reads it; see --help for the names", name)
    soft, hard = raise_open_file_limit()  # before the App, whose file-handle bound is taken from it
    log.debug("open-file limit soft=%d hard=%d", soft, hard)
    stdin, stdout = stdio() if "-" in args.paths else (None, None)
    waker = Waker(force_polling=config.force_polling, polling_interval=config.poll_interval,
                  recursive=config.kubernetes is not None)  # fmt: skip
    app = App(config, catalog, stdin=stdin, stdout=stdout, wake=waker.wake)
    registry = PageRegistry()  # /metrics answers from the collector's cached page
    registry.register(app.collector())
    if app.targets.discovery is not None:
        from .sources.kubeapi import DiscoveryCollector

        registry.register(DiscoveryCollector(app.targets.discovery))
    if app.events_poster is not None:
        from .kubeevents import EventsCollector

        registry.register(EventsCollector(app.events_poster))
    server = ExporterServer(address, registry=registry, catalog=catalog, events=app.store, health=app.loop.health,
                            web_config=web)  # fmt: skip
    app.catalog_listeners.append(server.set_catalog)
    try:
        otlp = _otlp_server(app, registry, web)
    except (OSError, ValueError) as exc:
        print(f"sglang-oom-exporter: bad configuration:\n{exc}", file=sys.stderr)
        return 2
    return _run(args, app, server, waker, web, otlp)


def _otlp_server(app: App, registry: PageRegistry, web: WebConfig | None) -> OtlpServer | None:
    """The OTLP/HTTP logs endpoint when --otlp-listen is set (web/otlp.py), its counters on /metrics."""
    receiver, config = app.receiver, app.config
    if receiver is None or config.otlp_listen is None:
        return None
    from .daemon.receiver import SpoolCollector
    from .web.otlp import OtlpCollector, OtlpServer  # protobuf and the OTLP classes: only when the receiver is on

    token = None
    if config.otlp_bearer_token_file:
        with open(config.otlp_bearer_token_file, encoding="utf-8") as fh:
            token = fh.read().strip()
        if not token:
            raise ValueError(f"otlp_bearer_token_file: {config.otlp_bearer_token_file} is empty")
    elif web is None or not (web.basic_auth_users or web.tls_client_ca_file):
        # Records name their pod themselves: an open port lets any client page for any pod (docs/otlp.md).
        log.warning("otlp receiver on %s is open: any client that reaches it can post an OOM for any namespace and "
                    "pod; set otlp_bearer_token_file (the chart does by default) or the web config's basic auth or "
                    "client certificates", config.otlp_listen)  # fmt: skip
    otlp = OtlpServer(parse_listen(config.otlp_listen), receiver, web_config=web, bearer_token=token,
                      max_request_bytes=config.otlp_max_request_kib * 1024)  # fmt: skip
    registry.register(OtlpCollector(otlp, lambda: (receiver.written, receiver.duplicates, receiver.filtered),
                                    receiver.spool.disk_bytes))  # fmt: skip
    registry.register(SpoolCollector(receiver.spool))
    return otlp


def _run(
    args: argparse.Namespace,
    app: App,
    server: ExporterServer,
    waker: Waker,
    web: WebConfig | None,
    otlp: OtlpServer | None = None,
) -> int:
    stop = threading.Event()

    def on_stop() -> None:
        log.info("signal: saving state and exiting")
        stop.set()
        waker.wake()

    def on_hup() -> None:
        app.loop.request_reload()
        waker.wake()

    def reload() -> None:
        try:
            config, catalog = _load(args)
        except _LOAD_ERRORS as exc:
            app.reload_failed(str(exc))
            return
        app.reload(config, catalog)

    # The handlers run on the relay's thread, never inside the main thread's locks (signals.py).
    relay = SignalRelay({signal.SIGTERM: on_stop, signal.SIGINT: on_stop, signal.SIGHUP: on_hup})
    relay.install()
    # Saved before anything else, before binding HTTP: a start killed after this point is known to the next one.
    app.loop.begin()
    try:
        server.start()
    except OSError as exc:
        relay.close()
        app.sources.close()
        print(f"sglang-oom-exporter: cannot listen on {app.config.listen}: {exc}", file=sys.stderr)
        return 2
    if otlp is not None:
        try:
            otlp.start()
        except OSError as exc:
            server.stop()
            relay.close()
            app.sources.close()
            print(f"sglang-oom-exporter: cannot listen on {app.config.otlp_listen} (OTLP): {exc}", file=sys.stderr)
            return 2
        log.info("receiving OTLP/HTTP logs on %s port=%d", app.config.otlp_listen, otlp.port)
        if app.receiver is not None:
            app.receiver.bound(otlp.port)
    log.info("serving on %s port=%d paths=%d kubernetes=%s state_dir=%s tls=%s", app.config.listen, server.port,
             len(app.config.paths), app.config.kubernetes is not None, app.config.state_dir,
             bool(web and web.tls_cert_file))  # fmt: skip
    try:
        app.loop.run(stop, waker=waker, services=[waker, *app.services()], reload=reload)
    finally:
        if otlp is not None:
            otlp.stop()  # first: no 2xx after the loop's last save
        server.stop()
        relay.close()
    return 0
