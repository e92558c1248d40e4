"""Kubernetes Events, the writer: one thread with a bounded queue that turns counted OOMs into Warning Events.

    EventSink (counting thread) --offer(): never blocks--> queue (QUEUE_SIZE) --> poster thread:
        ledger (a restart never posts an OOM twice) -> the pod, checked once by a GET (gone: its owner, or dropped)
        -> Correlator (create, patch the count, or rate-limited) -> POST / PATCH /api/v1/namespaces/<ns>/events

Core v1 Events, as client-go's tools/record writes them (kubelet's own pod events): `kubectl describe pod`
shows them with their count ("x3 over 10m"), and a repeat is a PATCH of count, lastTimestamp and message.
events.k8s.io/v1 would carry the same object (one storage, two views) with `series`, but asks for eventTime,
action and a series heartbeat, and gives `describe` nothing more.

Every outcome is counted by result (RESULTS; sglang_oom_exporter_k8s_events_total). A failure is logged once
per streak, never retried forever, and never delays counting: a full queue drops the Event and counts it.
Retries are client-go's (rest/with_retry.go): an answer from the server is final, except a 429 or a 5xx that
carries Retry-After (API Priority and Fairness answers Events with 429 exactly when a cluster is busy), tried
again after that many seconds (at most RETRY_AFTER_CAP) up to MAX_TRIES in all; a refused connection, which
never reached the server, is tried again twice (RETRY_DELAYS).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from ..catalog import Catalog
from ..detect.model import OomEvent
from ..sources.http import LABELS, HttpError, Reason
from ..sources.kubeclient import ApiClient
from .correlate import Correlator, event_name
from .ledger import Ledger, event_key
from .text import ObjectRef, message_for, pod_of, reason_for, runbook_url, wanted

log = logging.getLogger(__name__)

COMPONENT = "sglang-oom-exporter"  # source.component and reportingComponent: who wrote the Event
RESULTS = (
    "created", "updated", "owner", "rate_limited", "replayed", "pod_gone", "no_pod", "queue_full", "shutdown",
    "unauthorized", "forbidden", "conflict", "invalid", "http_error", "timeout", "unreachable", "tls", "no_token",
    "error",
)  # fmt: skip
WRITTEN = frozenset({"created", "updated", "owner"})
NOT_FAILURES = WRITTEN | {"rate_limited"}
QUEUE_SIZE = 256  # OOMs waiting for the API; more are dropped and counted (client-go keeps 1000 per process)
RETRY_DELAYS = (1.0, 5.0)  # after a refused connection only: the request never reached the server
MAX_TRIES = 10  # client-go's maxRetries for a 429 or 5xx with Retry-After
RETRY_AFTER_CAP = 10.0  # seconds: a longer Retry-After is waited this long (one Event never holds the queue long)
DRAIN_SECONDS = 2.0  # at shutdown, how long the queue may still be worked off
PODS_KEPT = 4096  # pods checked to exist (by uid), so a repeat needs no GET
_STATUS_RESULTS = {401: "unauthorized", 403: "forbidden", 404: "pod_gone", 409: "conflict", 422: "invalid"}


@dataclass(frozen=True, slots=True)
class _Item:
    event: OomEvent
    pod: ObjectRef
    wall: float  # when it was counted: the Event's timestamp, whatever the queue's delay


class EventPoster:
    """Posts one Warning Event per counted OOM of a pod; thread-safe offer(), results by RESULTS."""

    def __init__(
        self,
        client: ApiClient,
        catalog: Catalog,
        *,
        logs_root: str,
        node: str,
        nonfatal: bool = False,
        runbook_base: str = "",
        ledger: Ledger | None = None,
        correlator: Correlator | None = None,
        wall: Callable[[], float] = time.time,
        queue_size: int = QUEUE_SIZE,
        retry_delays: tuple[float, ...] = RETRY_DELAYS,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        """wait(seconds) is how a retry waits, True when a shutdown ended it (tests pass one that only records)."""
        self.client = client
        self.logs_root = logs_root
        self.node = node
        self.nonfatal = nonfatal
        self.runbook_base = runbook_base
        self.ledger = ledger if ledger is not None else Ledger(None)
        self.correlator = correlator if correlator is not None else Correlator()
        self.queue_size = queue_size
        self.retry_delays = retry_delays
        self._catalog = catalog
        self._wall = wall
        self._cond = threading.Condition()
        self._items: deque[_Item] = deque()
        self._stopping = False
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()  # set by stop(): ends a retry's wait
        self._wait = wait if wait is not None else self._halt.wait
        self.retries = 0  # tries again after a 429 or 5xx with Retry-After
        self._pods: OrderedDict[str, None] = OrderedDict()  # uids a GET found alive
        self._lock = threading.Lock()
        self.results = dict.fromkeys(RESULTS, 0)
        self._failing = ""  # the result of the current failure streak ("" when the last write worked)

    # --- the counting thread -------------------------------------------------------------------

    def set_catalog(self, catalog: Catalog) -> None:
        """A reloaded catalog: its kinds' names and words from the next Event on."""
        self._catalog = catalog

    def offer(self, event: OomEvent, labels: Mapping[str, str] | None = None) -> None:
        """Queue one counted OOM for its Event; never blocks. labels go unused: the log's path names the pod."""
        if not wanted(self._catalog, event, self.nonfatal):
            return
        pod = pod_of(self.logs_root, event)
        if pod is None:
            self._count("no_pod")
            return
        with self._cond:
            if self._stopped:
                self._count("shutdown")
                return
            if len(self._items) >= self.queue_size:
                self._count("queue_full")
                return
            self._items.append(_Item(event, pod, self._wall()))
            self._cond.notify()

    # --- the poster thread ---------------------------------------------------------------------

    def start(self) -> None:
        """Work off the queue in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("EventPoster already started")
        with self._cond:
            self._stopping = self._stopped = False
        self._halt.clear()
        self._thread = threading.Thread(target=self._run, name="k8s events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Work off what is queued for up to DRAIN_SECONDS, count the rest as shutdown; False if still running."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._halt.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(DRAIN_SECONDS + self.client.timeout + 1.0 if timeout is None else timeout)
        with self._cond:
            self._stopped = True
            left = len(self._items)
            self._items.clear()
        for _ in range(left):
            self._count("shutdown")
        return thread is None or not thread.is_alive()

    def _run(self) -> None:
        deadline: float | None = None
        while True:
            with self._cond:
                while not self._items and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    deadline = time.monotonic() + DRAIN_SECONDS if deadline is None else deadline
                    if not self._items or time.monotonic() >= deadline:
                        return
                item = self._items.popleft()
            self._handle_safely(item)

    def run_pending(self) -> int:
        """Handle every queued OOM in the calling thread (tests, and never together with start())."""
        handled = 0
        while True:
            with self._cond:
                if not self._items:
                    return handled
                item = self._items.popleft()
            self._handle_safely(item)
            handled += 1

    def _handle_safely(self, item: _Item) -> None:
        try:
            result = self._handle(item)
        except Exception as exc:  # a bug here must end neither the thread nor the daemon
            log.exception("k8s events: cannot post the Event of %s", item.event.location)
            result = "error"
            self._note(result, f"{type(exc).__name__}: {exc}", item)
        self._count(result)

    def _handle(self, item: _Item) -> str:
        """One OOM -> its Event (or none); the result to count."""
        key = event_key(item.event)
        if key in self.ledger:
            log.debug("k8s events: %s was taken before a restart; no second Event", item.event.location)
            return "replayed"  # counted again after a restart (a crash before the state was saved)
        self.ledger.take(key)  # before any call: at most once, whatever happens next
        catalog = self._catalog
        reason = reason_for(catalog, item.event)
        target, gone = self._target(item.pod)
        if target is None:
            self._note("pod_gone", f"pod {item.pod.namespace}/{item.pod.name} uid {item.pod.uid} is gone", item)
            return "pod_gone"
        prefix = f"Pod {item.pod.name} (uid {item.pod.uid}) is gone. " if gone else ""
        message = message_for(catalog, item.event, runbook_url(self.runbook_base, reason), prefix=prefix)
        decision = self.correlator.observe(target.uid, reason, event_name(target.name), item.wall)
        if decision.action == "skip":
            return "rate_limited"
        stamp = _timestamp(item.wall)
        if decision.action == "patch":
            patch = {"count": decision.count, "lastTimestamp": stamp, "message": message}
            result = self._call(item, "PATCH", _events_path(target.namespace, decision.name), patch,
                                "application/strategic-merge-patch+json", "updated")  # fmt: skip
            if result != "pod_gone":  # 404: the Event expired (1 h TTL) or was never written: create it anew
                return self._written(result, gone)
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": decision.name, "namespace": target.namespace},
            "involvedObject": target.as_dict(),
            "type": "Warning", "reason": reason, "message": message,
            "source": {"component": COMPONENT, "host": self.node},
            "firstTimestamp": _timestamp(decision.first_timestamp), "lastTimestamp": stamp, "count": decision.count,
            "reportingComponent": COMPONENT, "reportingInstance": self.node,
        }  # fmt: skip
        result = self._call(item, "POST", _events_path(target.namespace), body, "application/json", "created")
        return self._written(result, gone)

    def _written(self, result: str, gone: bool) -> str:
        return "owner" if gone and result in WRITTEN else result

    def _target(self, pod: ObjectRef) -> tuple[ObjectRef | None, bool]:
        """(the object to put the Event on, whether the pod is gone): the pod, its owner, or (None, True).

        One GET per pod uid: a pod that exists with our uid is remembered; a pod of that name with another uid was
        replaced (a LeaderWorkerSet recreating its group keeps the names), and its controller is the owner of ours;
        a 404 leaves no owner to name. A GET that fails otherwise (403 without `get pods`) names the pod as it is.
        """
        if pod.uid in self._pods:
            self._pods.move_to_end(pod.uid)
            return pod, False
        try:
            answer = self.client.request(
                "GET", f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/pods/{quote(pod.name, safe='')}"
            )
        except HttpError:
            return pod, False
        if answer.status == 404:
            return None, True
        if answer.status != 200:
            return pod, False
        try:
            doc = json.loads(answer.body)
            meta = doc["metadata"]
        except (ValueError, KeyError, TypeError):
            return pod, False
        if meta.get("uid") == pod.uid:
            self._pods[pod.uid] = None
            while len(self._pods) > PODS_KEPT:
                self._pods.popitem(last=False)
            return pod, False
        owners = meta.get("ownerReferences") or []
        owner = next((o for o in owners if isinstance(o, dict) and o.get("controller")), None)
        if owner is None or not all(isinstance(owner.get(k), str) for k in ("apiVersion", "kind", "name", "uid")):
            return None, True
        return ObjectRef(owner["apiVersion"], owner["kind"], pod.namespace, owner["name"], owner["uid"]), True

    def _call(self, item: _Item, method: str, path: str, doc: dict[str, Any], content_type: str, ok: str) -> str:
        """One write, tried again after a refused connection, or a 429 or 5xx with Retry-After; the result."""
        body = json.dumps(doc).encode()
        refused = list(self.retry_delays)
        tries = 0
        while True:
            tries += 1
            try:
                answer = self.client.request(method, path, body, content_type)
            except HttpError as exc:
                result = LABELS[exc.reason].k8s_events
                if exc.reason is Reason.REFUSED and refused and not self._wait(refused.pop(0)):
                    continue  # the poster's own thread waits; a shutdown ends the wait and the tries
                self._note(result, exc.detail, item)
                return result
            if answer.status in (200, 201):
                self._recovered()
                return ok
            delay = retry_after(answer.status, answer.retry_after)
            if delay is not None and tries < MAX_TRIES:
                log.debug("k8s events: HTTP %d, Retry-After %s: try %d of %d in %gs", answer.status,
                          answer.retry_after, tries + 1, MAX_TRIES, delay)  # fmt: skip
                self.retries += 1
                if not self._wait(delay):
                    continue
            result = _STATUS_RESULTS.get(answer.status, "http_error")
            if not (method == "PATCH" and answer.status == 404):
                after = f" after {tries} tries" if tries > 1 else ""
                self._note(result, f"HTTP {answer.status}{after}: {_status_message(answer.body)}", item)
            return result

    # --- results -------------------------------------------------------------------------------

    def _count(self, result: str) -> None:
        with self._lock:
            self.results[result] = self.results.get(result, 0) + 1

    def _note(self, result: str, detail: str, item: _Item) -> None:
        """A failure, logged once per streak (WARNING), then at DEBUG until an Event is written again."""
        level = logging.DEBUG if self._failing == result else logging.WARNING
        self._failing = result
        log.log(level, "k8s events: could not write the Event for pod %s/%s result=%s detail=%s",
                item.pod.namespace, item.pod.name, result, detail)  # fmt: skip

    def _recovered(self) -> None:
        if self._failing:
            log.info("k8s events: writing Events again after %s", self._failing)
            self._failing = ""

    def counts(self) -> dict[str, int]:
        """Events by result so far (a copy, for the collector)."""
        with self._lock:
            return dict(self.results)


def retry_after(status: int, header: str | None) -> float | None:
    """Seconds to wait before the next try of an answer client-go tries again (a 429 or 5xx with a Retry-After of
    whole seconds, rest.checkWait), at most RETRY_AFTER_CAP; None for a final answer."""
    if not (status == 429 or status >= 500) or header is None:
        return None
    text = header.strip()
    if not text.isascii() or not text.isdigit():
        return None  # client-go reads whole seconds only (an HTTP date is no retry there either)
    return min(float(text), RETRY_AFTER_CAP)


def _events_path(namespace: str, name: str | None = None) -> str:
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/events"
    return path if name is None else f"{path}/{quote(name, safe='')}"


def _timestamp(wall: float) -> str:
    """metav1.Time: RFC 3339 in UTC, whole seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall))


def _status_message(body: bytes) -> str:
    """The Status object's message, else the body's start."""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and isinstance(doc.get("message"), str):
            return str(doc["message"])[:200]
    except ValueError:
        pass
    return body[:200].decode("utf-8", "replace")
