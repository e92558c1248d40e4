"""Soak: the real daemon on N files under writers, a rotator and SIGKILLs, for a bounded time; exact counts.

Usage::

    python bench/soak.py [--seconds 180] [--files 200] [--ranks 4] [--rate 60] [--seed 1] [--json OUT]

What runs at once, in a temp dir, against one `serve --state-dir` daemon following `DIR/*.log`:

- a writer appends fatal prefill OOMs (each logged by every one of --ranks ranks with its traceback, one
  server-level event) to random files, every event's bytes split at random offsets into several write(2)s;
- a rotator, every 0.05-0.5 s, rotates a random file by rename (`f.log` -> `f.log.<n>`, the next write
  creates `f.log`), copytruncate (copy to `f.log.<n>`, truncate in place) or delete (the next write
  recreates it). It takes the file's lock, so it never cuts an event in two (logrotate's own race, a write
  between the copy and the truncate, is not exercised: it loses bytes by construction, in any tool);
- a killer SIGKILLs the daemon at random moments (a third of them within its first second after the
  restart, before it is ready), leaves it down 0-2 s while the writer and rotator go on, and restarts it.

Documented limits the soak keeps clear of, so that exactness is what is measured: a file is rotated at most
once while the daemon is down, and while it is up only once its generation is 2 s old (a generation created
and rotated away between two looks is never opened: README "Tailing"). Losses by design are counted apart
(`at_risk`; the check is 0 <= lost <= at_risk for those files, exact for every other file):
- a file deleted while the daemon is down takes with it whatever the daemon had not read;
- a generation whose first bytes were written while the daemon was down (or less than 2 s before the SIGKILL)
  and that was rotated before the daemon was back: no state names it;
- "down" lasts from the SIGKILL until the restarted daemon is ready and has finished its first pass over the
  files (until then it has not looked at what was written meanwhile): a delete in that time is one while down;
- a file deleted while the daemon is up, then a SIGKILL before the daemon saved its state (a save ending at
  least DELETE_SAVE_MARGIN after the delete): the events it counted within DELETE_KILL_WINDOW before the
  delete (the daemon saves at the delete and soon after counting, but a kill can come first). An event is
  counted soon after it is written, or, if written before the running daemon finished its first pass, when
  that pass re-reads it (a SIGKILL before its save left it to the restart).

At the end the writer and rotator stop, the daemon (restarted if down) catches up, and each file's
`sglang_oom_events_total{kind="prefill",source=...}` is compared with what was written to it.
RSS (VmRSS) of the daemon is sampled every 5 s with its uptime. Exit status 1 when a count is off.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import (
    Child,
    Children,
    free_port,
    http_get,
    metric,
    ours_argv,
    parse_prom,
    proc_status,
    raise_on_signals,
    wait_for,
)

TRACEBACK = (
    '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 9, in prepare_for_extend\n    x()\n'
)
ROTATE_GAP_UP = 2.0  # seconds a generation lives at least before it is rotated while the daemon is up
# A file deleted while the daemon is up takes with it what the daemon had not saved yet. It saves when it sees
# the delete and within about 0.5 s of counting an event; the events written this soon before a delete are at
# risk (counted apart, like a delete while down) if the daemon is SIGKILLed before a save that ended at least
# DELETE_SAVE_MARGIN after the delete (on a loaded machine a save of a large state file takes seconds).
DELETE_KILL_WINDOW = 3.0
DELETE_SAVE_MARGIN = 1.0


def counted_soon_before(writes_at: list[float], up_since: float, deleted_at: float) -> int:
    """Events of a generation deleted while up that the running daemon counted within DELETE_KILL_WINDOW of it.

    An event is counted soon after it is written, but one written before the running daemon finished its first
    pass (while down, or before the previous daemon saved it and was killed) is counted only then, when that
    daemon reads it again: its count is as young as that first pass, however old its bytes are.
    """
    return sum(1 for t in writes_at if deleted_at - max(t, up_since) <= DELETE_KILL_WINDOW)


@dataclass
class LogFile:
    """One followed file: what was written to it, and which of its events a delete while down put at risk."""

    path: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    written: int = 0
    generation: int = 0  # events written to the current generation
    at_risk: int = 0
    last_rotation: float = -1e9
    rotated_while_down: bool = False
    born: float = -1e9  # when the current generation got its first bytes (after a create or a truncate)
    born_down: bool = False  # ... while the daemon was down: no running daemon has looked at it yet
    writes_at: list[float] = field(default_factory=list)  # when each event of the current generation was written
    deleted_up: tuple[float, int] | None = None  # a delete while up: (wall time, events written just before)


@dataclass
class Tally:
    events: int = 0
    bytes: int = 0
    writes: int = 0
    rotations: dict[str, int] = field(default_factory=lambda: {"rename": 0, "copytruncate": 0, "delete": 0})
    kills: int = 0
    first_second_ages: list[float] = field(default_factory=list)  # daemon age at each first-second kill
    rss: list[tuple[float, float, int]] = field(default_factory=list)  # (soak time, daemon uptime, RSS KiB)


class Soak:
    """The daemon, its files and the three actors."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.root = root
        self.logs = root / "logs"
        self.logs.mkdir()
        self.state = root / "state"
        self.files = [LogFile(self.logs / f"f{i:03d}.log") for i in range(args.files)]
        self.tally = Tally()
        self.children = Children()
        self.port = free_port()
        self.daemon: Child | None = None
        self.started_at = 0.0
        self.down = threading.Event()  # set from a kill until the restarted daemon is ready
        self.up_since = time.monotonic()  # when the running daemon finished its first pass (down was cleared)
        self.stop = threading.Event()
        self.seq = 0
        self.second = 0
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.journal: list[tuple[float, str, str, object]] = []  # (soak time, file, what, detail) for --keep

    # --- the daemon -------------------------------------------------------------------------------

    def start_daemon(self) -> None:
        # warning: one line per counted event (requested=<its unique token count>) for --keep post-mortems
        extra = ["--poll-interval", "0.5s", "--traceback-wait", "1s", "--log-level", "warning"]
        argv = ours_argv(self.port, [str(self.logs / "*.log")], state_dir=str(self.state), extra=extra)
        self.daemon = self.children.start("serve", argv, self.root / f"serve-{self.tally.kills}.log")
        self.started_at = time.monotonic()
        self.journal.append((round(self.started_at - self.t0, 3), "-", "start", self.daemon.pid))

    def ready(self) -> bool:
        """/healthz answers and is past `starting`: every file's starting position is saved."""
        r = http_get(self.port, "/healthz", timeout=2.0)
        return r is not None and not r[1].startswith("starting")

    def kill(self) -> None:
        assert self.daemon is not None
        now = time.monotonic()
        self.journal.append((round(now - self.t0, 3), "-", "kill", self.daemon.pid))
        try:
            saved_at = (self.state / "state.json").stat().st_mtime
            if self.args.keep:  # what a restart will find, for the post-mortem
                shutil.copyfile(self.state / "state.json", self.root / f"state-at-kill-{self.tally.kills}.json")
        except OSError:
            saved_at = 0.0
        for f in self.files:
            with f.lock:
                if f.deleted_up is not None and saved_at < f.deleted_up[0] + DELETE_SAVE_MARGIN:
                    f.at_risk += f.deleted_up[1]
                f.deleted_up = None
                # Younger than a rotation while up may be: perhaps never looked at, as if born while down.
                f.born_down = f.born_down or now - f.born < ROTATE_GAP_UP
        self.down.set()
        self.children.stop(self.daemon, signal.SIGKILL, timeout=10)
        self.tally.kills += 1

    # --- actors -----------------------------------------------------------------------------------

    def event_bytes(self) -> tuple[int, bytes]:
        with self.lock:
            self.second += 3
            second = self.second
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_000_000 + second))
        text = f"Prefill out of memory. Try to lower your batch size.\nTry to allocate {second} tokens.\n"
        out = []
        for r in range(self.args.ranks):
            out.append(f"[{ts} TP{r}] {text}\n[{ts} TP{r}] Scheduler hit an exception: Traceback (most recent call "
                       f"last):\n{TRACEBACK}RuntimeError: {text}\n\n")  # fmt: skip
        return second, "".join(out).encode()

    def writer(self) -> None:
        while not self.stop.is_set():
            f = self.rng.choice(self.files)
            second, data = self.event_bytes()
            cuts = sorted(self.rng.sample(range(1, len(data)), self.rng.randint(1, 6)))
            with f.lock:
                if not f.path.exists() or f.path.stat().st_size == 0:
                    # The generation's first bytes (after a create, or a truncate): from now on it has an identity.
                    f.born, f.born_down = time.monotonic(), self.down.is_set()
                with open(f.path, "ab") as fh:
                    for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
                        fh.write(data[a:b])
                        fh.flush()
                        self.tally.writes += 1
                        if self.rng.random() < 0.1:
                            time.sleep(self.rng.uniform(0, 0.003))  # a rank's line split across the daemon's looks
                f.written += 1
                f.generation += 1
                f.writes_at.append(time.monotonic())
                self.journal.append((round(time.monotonic() - self.t0, 3), f.path.stem, "event", second))
                self.tally.events += 1
                self.tally.bytes += len(data)
            self.stop.wait(self.rng.expovariate(self.args.rate))

    def rotator(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.05, 0.5)):
            f = self.rng.choice(self.files)
            with f.lock:
                down = self.down.is_set()
                now = time.monotonic()
                young = now - max(f.last_rotation, f.born) < ROTATE_GAP_UP
                if (down and f.rotated_while_down) or (not down and young):
                    continue  # the documented limit: one generation per look
                if not f.path.exists():
                    continue
                self.seq += 1
                rotated = Path(f"{f.path}.{self.seq}")
                action = self.rng.choice(["rename", "copytruncate", "delete"])
                if action == "rename":
                    os.rename(f.path, rotated)
                elif action == "copytruncate":
                    shutil.copyfile(f.path, rotated)
                    os.truncate(f.path, 0)
                else:
                    os.unlink(f.path)
                    if down:
                        f.at_risk += f.generation  # by design: what the daemon had not read goes with the file
                    else:
                        recent = counted_soon_before(f.writes_at, self.up_since, now)
                        f.deleted_up = (time.time(), recent)  # at risk if a SIGKILL comes before a save after it
                if down and f.born_down and action != "delete":
                    # First bytes written and rotated while the daemon was down: no state names this generation
                    # (README "Tailing": a generation created and rotated away between two looks is never read).
                    f.at_risk += f.generation
                f.generation = 0
                f.writes_at = []
                f.last_rotation = now
                f.rotated_while_down = f.rotated_while_down or down
                self.tally.rotations[action] += 1
                self.journal.append((round(now - self.t0, 3), f.path.stem, action, down))

    def killer(self) -> None:
        while not self.stop.wait(self.rng.uniform(0.5, 12.0)):
            self.kill()
            self.stop.wait(self.rng.uniform(0.0, 2.0))
            self.start_daemon()
            if self.rng.random() < 1 / 3:
                # Again within its first second: before it is ready, or just after it saved its positions.
                time.sleep(self.rng.uniform(0.0, 1.0))
                self.tally.first_second_ages.append(round(time.monotonic() - self.started_at, 3))
                self.kill()
                self.stop.wait(self.rng.uniform(0.0, 2.0))
                self.start_daemon()
            self.wait_ready()

    def restart(self) -> None:
        self.start_daemon()
        self.wait_ready()

    def wait_ready(self) -> None:
        """Down until ready and one whole pass over the files done: until then it has not looked at them yet."""
        wait_for(self.ready_or_dead, timeout=60, what="the restarted daemon to be ready")
        ready_at = time.time()
        wait_for(lambda: self.looked_since(ready_at), timeout=60, what="the daemon's first pass after ready")
        for f in self.files:
            with f.lock:
                f.rotated_while_down = f.born_down = False
        self.up_since = time.monotonic()
        self.down.clear()

    def looked_since(self, wall: float) -> bool:
        """A pass of the daemon's loop ended after this wall time (the first one after ready sweeps every file)."""
        assert self.daemon is not None
        if self.daemon.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited: {self.daemon.tail()}")
        r = http_get(self.port, "/metrics", timeout=5.0)
        stamp = metric(parse_prom(r[1]), "sglang_oom_exporter_loop_timestamp_seconds") if r is not None else None
        return stamp is not None and stamp > wall

    def ready_or_dead(self) -> bool:
        assert self.daemon is not None
        if self.daemon.proc.poll() is not None:
            raise RuntimeError(f"the daemon exited: {self.daemon.tail()}")
        return self.ready()

    def sampler(self) -> None:
        while not self.stop.wait(5.0):
            self.sample()

    def sample(self) -> None:
        d = self.daemon
        if d is None or d.proc.poll() is not None:
            return
        try:
            rss = proc_status(d.pid).get("VmRSS", 0)
        except OSError:
            return  # killed between the check and the read
        self.tally.rss.append((time.monotonic() - self.t0, time.monotonic() - self.started_at, rss))

    # --- the run ----------------------------------------------------------------------------------

    def run(self) -> dict[str, object]:
        for f in self.files:
            f.path.write_text("[2026-03-14 22:00:00 TP0] Load weight end.\n")  # history: read from the end
        self.start_daemon()
        wait_for(self.ready_or_dead, timeout=60, what="the daemon to be ready")
        chosen = (
            [self.writer]
            + ([] if self.args.no_rotate else [self.rotator])
            + ([] if self.args.no_kill else [self.killer])
        )
        actors = [threading.Thread(target=t, daemon=True) for t in chosen]
        sampler = threading.Thread(target=self.sampler, daemon=True)
        for t in (*actors, sampler):
            t.start()
        self.stop.wait(self.args.seconds)
        self.stop.set()
        for t in actors:
            t.join(timeout=120)
        if self.down.is_set() or self.daemon is None or self.daemon.proc.poll() is not None:
            self.restart()
        counted = self.settle()
        self.sample()
        return self.report(counted)

    def settle(self) -> dict[str, float]:
        """Wait until the daemon has caught up for a whole pass of its loop, then read every file's count."""
        total = sum(f.written for f in self.files)
        risk = sum(f.at_risk for f in self.files)
        first: list[float] = []

        def caught_up() -> dict[str, float] | None:
            r = http_get(self.port, "/metrics", timeout=10)
            if r is None:
                return None
            m = parse_prom(r[1])
            seen = metric(m, "sglang_oom_events_total", kind="prefill") or 0.0
            idle = (metric(m, "sglang_oom_exporter_pending_events") == 0
                    and metric(m, "sglang_oom_exporter_busy_sources") == 0
                    and (metric(m, "sglang_oom_exporter_file_lag_bytes") or 0) == 0)  # fmt: skip
            stamp = metric(m, "sglang_oom_exporter_loop_timestamp_seconds") or 0.0
            if not idle:
                first.clear()
                return None
            first[:1] = first[:1] or [stamp]
            # Caught up for a whole pass; short of the total, give late bytes 15 s more before reporting.
            if stamp <= first[0] or (seen < total - risk and stamp < first[0] + 15):
                return None
            return {f.path.stem: metric(m, "sglang_oom_events_total", kind="prefill", source=f.path.stem) or 0.0
                    for f in self.files}  # fmt: skip

        return wait_for(caught_up, timeout=300, interval=0.2, what="the daemon to catch up")

    def report(self, counted: dict[str, float]) -> dict[str, object]:
        exact_files = [f for f in self.files if f.at_risk == 0]
        risky = [f for f in self.files if f.at_risk]
        wrong = [(f.path.stem, f.written, counted[f.path.stem]) for f in exact_files
                 if counted[f.path.stem] != f.written]  # fmt: skip
        lost_by_design = sum(f.written - counted[f.path.stem] for f in risky)
        out_of_bounds = [(f.path.stem, f.written, counted[f.path.stem], f.at_risk) for f in risky
                         if not 0 <= f.written - counted[f.path.stem] <= f.at_risk]  # fmt: skip
        rss = [kib for *_, kib in self.tally.rss]
        return {
            "seconds": self.args.seconds, "files": self.args.files, "ranks": self.args.ranks, "seed": self.args.seed,
            "events_written": self.tally.events, "bytes_written": self.tally.bytes, "writes": self.tally.writes,
            "rotations": self.tally.rotations, "kills": self.tally.kills,
            "kills_in_first_second_at_age_s": self.tally.first_second_ages,
            "events_counted": sum(counted.values()),
            "exact_files": len(exact_files), "exact_files_written": sum(f.written for f in exact_files),
            "exact_files_counted": sum(counted[f.path.stem] for f in exact_files), "miscounted_files": wrong,
            "at_risk_files": len(risky), "at_risk_events": sum(f.at_risk for f in risky),
            "lost_by_design": lost_by_design, "out_of_bounds": out_of_bounds,
            "rss_kib_samples": self.tally.rss, "peak_rss_kib": max(rss, default=0),
        }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run the soak and print its figures; exit 1 when a count is off."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=180.0, help="how long the writers, rotator and killer run")
    p.add_argument("--files", type=int, default=200)
    p.add_argument("--ranks", type=int, default=4, help="ranks that log each OOM (one event)")
    p.add_argument("--rate", type=float, default=60.0, help="mean events written per second")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--no-rotate", action="store_true", help="no rotator (to tell faults apart)")
    p.add_argument("--no-kill", action="store_true", help="no SIGKILLs (to tell faults apart)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs, state, daemon output)")
    args = p.parse_args(argv)
    raise_on_signals()  # so a SIGTERM still stops the daemon this soak started
    root = Path(tempfile.mkdtemp(prefix="oom-soak-"))
    soak = Soak(args, root)
    try:
        result = soak.run()
    finally:
        soak.stop.set()
        soak.children.stop_all()
        if args.keep:
            (root / "journal.json").write_text(json.dumps(soak.journal))
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    for t, up, kib in result["rss_kib_samples"]:  # type: ignore[attr-defined]
        print(f"rss t={t:7.1f}s daemon_uptime={up:6.1f}s rss={kib / 1024:6.1f} MiB")
    summary = {k: v for k, v in result.items() if k != "rss_kib_samples"}
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    ok = not result["miscounted_files"] and not result["out_of_bounds"]
    print("soak: exact" if ok else "soak: COUNTS OFF")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
