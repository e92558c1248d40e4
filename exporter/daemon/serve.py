"""`serve`: build the daemon from the command line and run it until a signal. Edge code: signals,
logging, the HTTP server and the watcher are started and stopped here, and nowhere else.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from dataclasses import replace
from typing import Any

from prometheus_client import CollectorRegistry

from ..catalog.loader import CatalogError, load_catalog
from ..config import Config, ConfigError, load_config
from ..daemon.app import App, stdio
from ..metrics import ExporterCollector
from ..sources.scrape import ScrapeLoop
from ..sources.watch import Waker
from ..web.server import ExporterServer, parse_address
from ..web.webconfig import WebConfig, load_web_config

log = logging.getLogger("sglang_oom_exporter")

_FLAG_KEYS = ("listen", "state_dir", "from_beginning", "kubernetes_logs", "config", "force_polling", "poll_interval",
              "sweep_interval",
              "traceback_wait", "source_retention", "web_config", "log_level", "catalog", "prefix_regex",
              "sglang_url", "scrape_interval", "scrape_timeout")  # fmt: skip


def _flags(args: argparse.Namespace) -> dict[str, Any]:
    flags = {key: getattr(args, key, None) for key in _FLAG_KEYS}
    flags["paths"] = list(args.paths)
    return flags


def _load(args: argparse.Namespace) -> tuple[Config, Any, WebConfig | None, tuple[str, int]]:
    config = load_config(flags=_flags(args))
    catalog = load_catalog(config.catalog)
    web = load_web_config(config.web_config) if config.web_config else None
    return config, catalog, web, parse_address(config.listen)


def serve(args: argparse.Namespace) -> int:
    """Run the daemon; returns the process exit status."""
    try:
        config, catalog, web, address = _load(args)
    except (ConfigError, CatalogError, ValueError) as exc:
        print(f"sglang-oom-exporter: bad configuration:\n{exc}", file=sys.stderr)
        return 1 if args.check_config else 2
    if args.check_config:
        print(f"configuration ok: {len(config.paths)} path(s), kubernetes={'on' if config.kubernetes else 'off'}, "
              f"listen {config.listen}, {len(catalog.kinds)} OOM kinds")  # fmt: skip
        return 0
    logging.basicConfig(
        level=config.log_level.upper(), stream=sys.stderr,
        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
    )  # fmt: skip
    stdin = stdout = None
    if "-" in config.paths:
        stdin, stdout = stdio()
        config = replace(config, paths=tuple(p for p in config.paths if p != "-"))
    waker = Waker(force_polling=config.force_polling, polling_interval=config.poll_interval,
                  recursive=config.kubernetes is not None)  # fmt: skip
    app = App(config, catalog, stdin=stdin, stdout=stdout, wake=waker.wake)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ExporterCollector(app.counts, app.source_stats, app.extra_metrics, app.targets))
    server = ExporterServer(address, registry=registry, catalog=catalog, events=app.store, health=app.health,
                            web_config=web)  # fmt: skip
    stop = threading.Event()
    reload_requested = threading.Event()

    def on_stop(signum: int, _frame: Any) -> None:
        log.info("signal %s: saving state and exiting", signal.Signals(signum).name)
        stop.set()
        waker.wake()

    def on_hup(_signum: int, _frame: Any) -> None:
        reload_requested.set()
        waker.wake()

    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    try:
        server.start()
    except OSError as exc:
        print(f"sglang-oom-exporter: cannot listen on {config.listen}: {exc}", file=sys.stderr)
        return 2
    log.info("serving on %s:%d paths=%d kubernetes=%s state_dir=%s", address[0] or "*", server.port,
             len(config.paths), config.kubernetes is not None, config.state_dir)  # fmt: skip
    app.load_state()
    app.start_stdin()
    waker.start()
    # One thread per SGLang endpoint, so a hanging endpoint never delays another or the log tailing.
    scrape_loop = ScrapeLoop(app.scrapers, config.scrape_interval)
    scrape_loop.start()

    watched: list[set[str] | None] = [None]

    def wait(timeout: float) -> bool:
        woke = waker.wait(timeout)
        if reload_requested.is_set():
            reload_requested.clear()
            try:
                new, _, _, _ = _load(args)
                app.reload(new)
            except (ConfigError, CatalogError, ValueError) as exc:
                log.error("reload failed, keeping the running configuration: %s", str(exc).replace("\n", "; "))
        changed = waker.take_changed()
        app.mark_changed(changed)
        if changed is None or changed:
            app.request_discover()
        dirs = app.watch_dirs()
        if dirs is not watched[0]:  # the app hands back the same set until its sources change
            waker.watch_dirs(dirs)
            watched[0] = dirs
        return woke

    try:
        app.step()
        waker.watch_dirs(app.watch_dirs())
        app.run(stop, wake=wait)
    finally:
        scrape_loop.stop()
        app.shutdown()
        waker.stop()
        server.stop()
    return 0
