"""The cached exposition: every family the exporter owns, encoded as it changes, so a scrape only joins bytes.

Sits between the counters (events.py, sources.py) and the HTTP edge (web/routes.py). Writers (the loop's
thread) set a series' value; the family re-encodes that one line and bumps its chunk's generation. A scrape
takes the page lock only to join the cached chunks: it never waits for a read slice, and its cost is a copy of
the page, not a walk over the sources. Each chunk also keeps its own raw-deflate segment (flushed with
Z_FULL_FLUSH, so segments concatenate into one valid stream), so a gzip scrape compresses only the chunks that
changed since the last one.

Format: the sample lines are the same in the text format (0.0.4) and OpenMetrics; only the HELP/TYPE head
differs (counters are named with `_total` in the text format's head, without it in OpenMetrics').
"""

from __future__ import annotations

import struct
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

from prometheus_client import CollectorRegistry, generate_latest, openmetrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

CHUNK_SERIES = 512  # series per cached chunk: a change re-encodes and re-compresses one chunk, not the family
_GZIP_HEAD = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"  # deflate, no name, no mtime, unknown OS
_DEFLATE_END = zlib.compressobj(wbits=-15).flush()  # an empty final block: closes the concatenated segments
EOF = b"# EOF\n"
# prometheus_client's own writers (untyped): the sample values and the families read now use the same format.
_go_float = cast(Callable[[float], str], floatToGoString)
_text = cast(Callable[[Collector], bytes], generate_latest)
_openmetrics = cast(Callable[[Collector], bytes], openmetrics.exposition.generate_latest)

Key = tuple[str, ...]


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _value(line: bytes) -> float:
    """The value at the end of an encoded sample line (Go's float text: float() reads +Inf, NaN, 1e+06)."""
    return float(line[line.rindex(b" ") + 1 :])


def _deflate(data: bytes) -> bytes:
    """A raw deflate segment that ends on a byte boundary with a fresh dictionary: segments concatenate."""
    # Level 1: a 16 MB page (10,000 files) compresses 3.7x faster than at level 6 and only 5% larger.
    c = zlib.compressobj(1, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


@dataclass(slots=True)
class Part:
    """A piece of the page: its bytes and, when cached, their deflate segment (None: compress per scrape)."""

    text: bytes
    deflated: bytes | None = None


class _Chunk:
    """Up to CHUNK_SERIES encoded lines of a family, with the joined bytes and their deflate cached.

    Only the encoded line is kept per series (its value is read back from it when asked): at 10,000 sources,
    220,000 series, a second dictionary of values cost about 10 MB.
    """

    __slots__ = ("lines", "part")

    def __init__(self) -> None:
        self.lines: dict[Key, bytes] = {}
        self.part: Part | None = None  # None: changed since last joined

    def get_part(self) -> Part:
        if self.part is None:
            self.part = Part(b"".join(self.lines.values()))
        return self.part


class Family:
    """One metric family: its head per format and its series as cached lines; mutate under the page lock."""

    def __init__(self, name: str, typ: str, doc: str, label_names: Sequence[str]) -> None:
        self.name, self.type, self.doc = name, typ, doc
        self.label_names = tuple(label_names)
        self.sample_name = f"{name}_total" if typ == "counter" else name
        # Both formats sort the label names of a sample; the order of the values follows.
        self._order = sorted(range(len(self.label_names)), key=lambda i: self.label_names[i])
        self._chunks: list[_Chunk] = []
        self._where: dict[Key, _Chunk] = {}
        text_name = self.sample_name
        text_doc = doc.replace("\\", r"\\").replace("\n", r"\n")
        om_doc = _escape_label(doc)
        self._heads = {
            False: Part(f"# HELP {text_name} {text_doc}\n# TYPE {text_name} {typ}\n".encode()),
            True: Part(f"# HELP {name} {om_doc}\n# TYPE {name} {typ}\n".encode()),
        }
        for head in self._heads.values():
            head.deflated = _deflate(head.text)

    def set(self, key: Key, value: float) -> None:
        """Set one series (label values in label_names order); re-encodes it only when the value changed."""
        chunk = self._where.get(key)
        if chunk is None:
            chunk = self._chunks[-1] if self._chunks and len(self._chunks[-1].lines) < CHUNK_SERIES else None
            if chunk is None:
                chunk = _Chunk()
                self._chunks.append(chunk)
            self._where[key] = chunk
        labels = ",".join(f'{self.label_names[i]}="{_escape_label(key[i])}"' for i in self._order)
        line = f"{self.sample_name}{{{labels}}} {_go_float(value)}\n" if labels else (
            f"{self.sample_name} {_go_float(value)}\n"
        )  # fmt: skip
        encoded = line.encode()
        if chunk.lines.get(key) != encoded:
            chunk.lines[key] = encoded
            chunk.part = None

    def add(self, key: Key, delta: float) -> None:
        """Add to one series (created at delta)."""
        self.set(key, self.value(key) + delta)

    def value(self, key: Key) -> float:
        """The series' value (0 when absent)."""
        chunk = self._where.get(key)
        return 0.0 if chunk is None else _value(chunk.lines[key])

    def has(self, key: Key) -> bool:
        """Whether the series exists."""
        return key in self._where

    def discard(self, key: Key) -> None:
        """Remove one series, if present."""
        chunk = self._where.pop(key, None)
        if chunk is None:
            return
        del chunk.lines[key]
        chunk.part = None
        if not chunk.lines:
            self._chunks.remove(chunk)

    def discard_where(self, pred: Callable[[Key], bool]) -> None:
        """Remove every series whose key satisfies pred."""
        for key in [k for k in self._where if pred(k)]:
            self.discard(key)

    def keys(self) -> list[Key]:
        """Every series' key, in page order."""
        return [k for c in self._chunks for k in c.lines]

    def parts(self, openmetrics: bool) -> Iterator[Part]:
        """The head for the format, then the cached chunks."""
        yield self._heads[openmetrics]
        for chunk in self._chunks:
            yield chunk.get_part()

    def metric(self) -> Metric:
        """The same family as a prometheus_client Metric (the registry path: tests, generate_latest)."""
        cls = CounterMetricFamily if self.type == "counter" else GaugeMetricFamily
        m = cls(self.name, self.doc, labels=list(self.label_names))
        for chunk in self._chunks:
            for key, line in chunk.lines.items():
                m.add_metric(list(key), _value(line))
        return m


class Page:
    """The exporter's own families in page order, behind one lock the writers and the scrapes share briefly."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._families: list[Family] = []
        self.scrapes = 0  # pages served: a series on its way out stays until a scrape has shown its last value

    def family(self, name: str, typ: str, doc: str, label_names: Sequence[str] = ()) -> Family:
        """Add a family at the end of the page."""
        fam = Family(name, typ, doc, label_names)
        with self.lock:
            self._families.append(fam)
        return fam

    def parts(self, openmetrics: bool, names: frozenset[str] | None = None) -> list[Part]:
        """The page's parts for one scrape (names: only families with these sample names)."""
        with self.lock:
            self.scrapes += 1
            return [p for f in self._families if names is None or f.sample_name in names for p in f.parts(openmetrics)]

    def metrics(self) -> list[Metric]:
        """Every family as a prometheus_client Metric."""
        with self.lock:
            self.scrapes += 1
            return [f.metric() for f in self._families]


def join_plain(parts: Iterable[Part]) -> bytes:
    """The page as plain bytes."""
    return b"".join(p.text for p in parts)


def join_gzip(parts: Sequence[Part]) -> bytes:
    """The page as one gzip member: cached deflate segments joined, the others compressed now (and kept)."""
    crc, size, segments = 0, 0, [_GZIP_HEAD]
    for p in parts:
        crc = zlib.crc32(p.text, crc)
        size += len(p.text)
        if p.deflated is None:
            # A Part is replaced, never changed, when its chunk changes: keeping the segment on it is safe.
            p.deflated = _deflate(p.text)
        segments.append(p.deflated)
    segments += [_DEFLATE_END, struct.pack("<II", crc, size & 0xFFFFFFFF)]
    return b"".join(segments)


class Fixed(Collector):
    """A collector over metrics already built (to encode them with prometheus_client's own writers)."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self._metrics = list(metrics)

    def collect(self) -> Iterable[Metric]:
        return self._metrics


def encode(source: Collector, openmetrics_format: bool) -> bytes:
    """A collector's families in one of the two formats, without OpenMetrics' closing EOF line."""
    if not openmetrics_format:
        return _text(source)
    text = _openmetrics(source)
    return text[: -len(EOF)] if text.endswith(EOF) else text


class PageCollector(Collector):
    """A collector that can also answer a scrape as cached page parts (metrics/collector.ExporterCollector)."""

    def parts(self, openmetrics: bool, names: frozenset[str] | None = None) -> list[Part]:
        """The collector's families as page parts."""
        raise NotImplementedError


class PageRegistry(CollectorRegistry):
    """A CollectorRegistry whose page collectors answer /metrics from their cache; the others are encoded per scrape."""

    def __init__(self) -> None:
        super().__init__(auto_describe=False)
        self._paged: list[PageCollector] = []
        self._others = CollectorRegistry(auto_describe=False)

    def register(self, collector: Collector) -> None:
        """Register for both paths: collect() (every collector) and render() (cached parts where there are some)."""
        super().register(collector)
        if isinstance(collector, PageCollector):
            self._paged.append(collector)
        else:
            self._others.register(collector)

    def render(self, openmetrics_format: bool, names: Iterable[str] | None = None) -> list[Part]:
        """One scrape's parts, ending with OpenMetrics' EOF line when that is the format."""
        wanted = None if names is None else frozenset(names)
        parts = [p for c in self._paged for p in c.parts(openmetrics_format, wanted)]
        others: Collector = self._others if wanted is None else self._others.restricted_registry(list(wanted))
        parts.append(Part(encode(others, openmetrics_format)))
        if openmetrics_format:
            parts.append(Part(EOF))
        return parts
