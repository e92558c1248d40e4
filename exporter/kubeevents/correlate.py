"""Kubernetes Events, the recorder's bookkeeping: create or patch, and the spam filter, as client-go does it. Pure.

    (object, reason) --Correlator.observe(now)--> Decision: create | patch (count n) | skip (rate limited)

Mirrors client-go's tools/record/events_cache.go (EventCorrelator, numbers from its source):
- Repeats update one Event: the first occurrence is created with count 1; each later one of the same reason on
  the same object is a PATCH of that Event's count, lastTimestamp and message. client-go keys this on the exact
  message and folds differing messages together only after 10 in 10 minutes (its aggregator, keyed on the
  object and reason); every OOM message carries its own token numbers, so we key on object and reason at once,
  which is the aggregator's key, and the latest numbers replace the message.
- The spam filter is a token bucket per source and object (client-go's getSpamKey: component, host, object,
  type; the reason is not part of it): a burst of 25, refilled at 1 per 300 s. Like client-go, a filtered
  occurrence still counts: the next Event that passes carries the full count.
- Both caches are LRUs of 4096 entries (maxLruCacheEntries).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

SPAM_BURST = 25  # defaultSpamBurst
SPAM_QPS = 1.0 / 300.0  # defaultSpamQPS: one token every 5 minutes
LRU_ENTRIES = 4096  # maxLruCacheEntries


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one occurrence: create (count 1), patch (the Event named name, to count), or skip."""

    action: str  # create | patch | skip
    name: str
    count: int
    first_timestamp: float  # wall seconds of the Event's first occurrence


@dataclass(slots=True)
class _Bucket:
    """client-go's token bucket (flowcontrol.NewTokenBucketPassiveRateLimiter): full at first."""

    tokens: float
    last: float

    def try_accept(self, now: float, burst: int, qps: float) -> bool:
        self.tokens = min(float(burst), self.tokens + max(0.0, now - self.last) * qps)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(slots=True)
class _Seen:
    name: str
    count: int
    first: float


class Correlator:
    """Per (object, reason): the Event's name and count; per object: the spam filter's bucket."""

    def __init__(self, *, burst: int = SPAM_BURST, qps: float = SPAM_QPS, entries: int = LRU_ENTRIES) -> None:
        self.burst, self.qps, self.entries = burst, qps, entries
        self._seen: OrderedDict[tuple[str, str], _Seen] = OrderedDict()
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()

    def observe(self, obj: str, reason: str, new_name: str, now: float) -> Decision:
        """One occurrence of reason on obj (its uid) at wall time now; new_name names a new Event."""
        key = (obj, reason)
        seen = self._seen.pop(key, None)
        if seen is None:
            seen = _Seen(new_name, 1, now)
            action = "create"
        else:
            seen.count += 1
            action = "patch"
        self._put(self._seen, key, seen)
        bucket = self._buckets.pop(obj, None) or _Bucket(float(self.burst), now)
        accepted = bucket.try_accept(now, self.burst, self.qps)
        self._put(self._buckets, obj, bucket)
        if not accepted:
            return Decision("skip", seen.name, seen.count, seen.first)
        return Decision(action, seen.name, seen.count, seen.first)

    def _put(self, cache: OrderedDict, key: object, value: object) -> None:  # type: ignore[type-arg]
        cache[key] = value
        while len(cache) > self.entries:
            cache.popitem(last=False)


def event_name(obj_name: str, now_ns: int | None = None) -> str:
    """client-go's GenerateEventName: <object name>.<unix nanoseconds in hex>, within a DNS subdomain's 253."""
    stamp = f"{time.time_ns() if now_ns is None else now_ns:x}"
    return f"{obj_name[: 252 - len(stamp)]}.{stamp}"
