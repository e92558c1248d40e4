"""Kubernetes Events, the words: which object an OOM's Event names, its reason and its message. Pure.

    OomEvent (+ the pod log's path) --pod_of / reason_for / message_for--> the fields of one Warning Event

The reason is the alert name the rendered rule pack gives the event (SGLangPrefillOOM, ..., SGLangCrashed), derived
from the catalog the same way render does, so an Event, an alert and a runbook page share one name. The message is one
paragraph under 1 kB (the events.k8s.io limit on a note): what happened with its numbers, the concrete
suggestion when the exporter has one (else the catalog's one-line fix), and the runbook URL, which is never cut.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..catalog import Catalog
from ..detect.model import OomEvent
from ..events.sink import explanation
from ..render.alertspec import CRASHED, RETRACTIONS_HIGH, alert_name
from ..render.options import RenderOptions, runbook_page_url
from ..sources.discover import PodLogRef, pod_log_ref

MESSAGE_LIMIT = 1023  # bytes: events.k8s.io/v1 refuses a note of 1 kB or more (core v1 takes it, kubectl wraps it)


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """The object an Event is about (involvedObject): the pod, or its owner once the pod is gone."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str
    field_path: str = ""

    def as_dict(self) -> dict[str, str]:
        """The involvedObject JSON."""
        ref = {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name,
               "uid": self.uid}  # fmt: skip
        if self.field_path:
            ref["fieldPath"] = self.field_path
        return ref


def pod_of(logs_root: str, event: OomEvent) -> ObjectRef | None:
    """The pod (and container) whose log the event came from: /var/log/pods/<ns>_<pod>_<uid>/<container>/<n>.log.

    None for a plain file or stdin: no pod to put an Event on.
    """
    path = event.location.rpartition(":")[0]
    ref: PodLogRef | None = pod_log_ref(logs_root, path) if path and path != "-" else None
    if ref is None:
        return None
    return ObjectRef("v1", "Pod", ref.namespace, ref.pod, ref.uid, f"spec.containers{{{ref.container}}}")


def wanted(catalog: Catalog, event: OomEvent, nonfatal: bool) -> bool:
    """Whether the event gets an Event: every fatal one; non-fatal ones (retractions, aborts) only when asked."""
    return (event.fatal or nonfatal) and event.kind in catalog.event_ids


def reason_for(catalog: Catalog, event: OomEvent) -> str:
    """The alert name the rule pack gives this event: <kind>OOM when fatal, else the kind's non-fatal alert;
    SGLangCrashed for a non-memory crash."""
    kind = catalog.kind(event.kind)
    if catalog.is_crash(kind.id):
        return CRASHED
    if not event.fatal:
        non_fatal = kind.alert.get("non_fatal")
        if isinstance(non_fatal, dict) and non_fatal.get("name"):
            return alert_name(kind.id, str(non_fatal["name"]))
        if kind.id == catalog.retraction_kind:
            return RETRACTIONS_HIGH
    return alert_name(kind.id)


def runbook_url(base: str, reason: str) -> str:
    """The runbook page of the alert named reason (base empty: the project's default runbook base)."""
    return runbook_page_url(RenderOptions(runbook_base_url=base) if base else RenderOptions(), reason)


def message_for(catalog: Catalog, event: OomEvent, runbook: str, prefix: str = "") -> str:
    """What happened with its numbers, the suggestion (or the fix), the runbook URL; under 1 kB. The words are
    the ones scan, /events and sglang_oom_last_event_info give (events.sink.explanation)."""
    kind = catalog.kind(event.kind)
    told = explanation(event, catalog)
    what = prefix + kind.title + (f": {told.what}" if told.what else "")
    if len(event.ranks) > 1:
        what += f" (ranks {', '.join(event.ranks)})"
    return _fit(f"{what}.", told.advice, runbook)


def _fit(what: str, advice: str, runbook: str) -> str:
    """Join the parts within MESSAGE_LIMIT bytes: the advice is cut first, then what happened; never the URL."""
    tail = f" {runbook}"
    room = MESSAGE_LIMIT - len(tail.encode())
    if len(what.encode()) + 1 + len(advice.encode()) > room and len(what.encode()) > room // 2:
        what = _cut(what, room // 2)
    advice = _cut(advice, room - len(what.encode()) - 1)
    return _cut(f"{what} {advice}{tail}", MESSAGE_LIMIT)  # the last cut only for an absurdly long runbook URL


def _cut(text: str, limit: int) -> str:
    """text within limit UTF-8 bytes, ending in an ellipsis when cut (never mid-character)."""
    data = text.encode()
    if len(data) <= limit:
        return text
    return data[: max(0, limit - 3)].decode("utf-8", "ignore") + "..."


def node_name(env: Mapping[str, str]) -> str:
    """The reportingInstance: NODE_NAME (the chart sets it from the downward API), else the host name."""
    return (env.get("NODE_NAME") or os.uname().nodename)[:128]
