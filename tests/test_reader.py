"""The prefiltering reader: line accounting, giant lines, and both literal finders agreeing."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_oom_exporter.detect import reader as reader_module
from sglang_oom_exporter.detect.decode import Decoder, stream_of
from sglang_oom_exporter.detect.finder import BytesFinder, make_finder, minimal_literals
from sglang_oom_exporter.detect.model import Gap, RawLine
from sglang_oom_exporter.detect.reader import LineReader
from sglang_oom_exporter.scan.serial import scan_stream
from tests.support.helpers import CATALOG, MATCHER, scan_bytes

OOM = b"[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\nTry to allocate 7 tokens.\n\n"


def _drain(reader: LineReader, chunks: list[bytes]) -> list[RawLine | Gap]:
    out: list[RawLine | Gap] = []
    for c in chunks:
        out.extend(reader.feed(c))
    out.extend(reader.finish())
    return out


class _Stages:
    """A stand-in for the stages after the reader: busy for `after` lines after each line holding `opens`. It takes
    the reader's items one by one, as the pipeline does, so the reader asks about the state the lines before left."""

    def __init__(self, opens: bytes, after: int) -> None:
        self.opens, self.after, self.left = opens, after, 0

    def busy(self) -> bool:
        return self.left > 0

    def take(self, items):
        out = []
        for item in items:
            if isinstance(item, RawLine):
                self.left = self.after if self.opens in item.data else max(self.left - 1, 0)
            out.append(item)
        return out


def test_every_line_is_either_passed_or_counted_in_a_gap():
    filler = b"".join(b"[2026-03-14 22:07:3%d TP0] Decode batch, #running-req: 1\n" % (i % 10) for i in range(5000))
    data = filler + OOM + filler + b"no newline at the end"
    stages = _Stages(b"ut of memory", 2)
    reader = LineReader(["ut of memory"], before=3, busy=stages.busy)
    items = [*stages.take(reader.feed(data)), *stages.take(reader.finish())]
    passed = [i for i in items if isinstance(i, RawLine)]
    gaps = sum(i.lines for i in items if isinstance(i, Gap))
    assert len(passed) + gaps == 10_004
    assert reader.lines_read == 10_004
    assert [p.lineno for p in passed] == list(range(4998, 5004))  # 3 before, the anchor line, 2 after
    assert passed[3].data.startswith(b"[2026-03-14 22:07:33 TP0] Prefill")


def test_line_numbers_survive_any_chunking():
    data = (b"x\n" * 300 + OOM) * 3
    whole = [(i.lineno, i.data) for i in _drain(LineReader(["ut of memory"]), [data]) if isinstance(i, RawLine)]
    for size in (1, 2, 7, 64, 1000):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        got = [(i.lineno, i.data) for i in _drain(LineReader(["ut of memory"]), chunks) if isinstance(i, RawLine)]
        assert got == whole, size


def test_giant_line_is_cut_and_counted_and_the_next_oom_still_counts():
    giant = b"A" * (3 * 1024 * 1024)
    data = giant + b"\n" + OOM
    events, stats = scan_stream(CATALOG, MATCHER, "g.log", io.BytesIO(data), chunk=64 * 1024)
    assert [(e.kind, e.location) for e in events] == [("prefill", "g.log:2")]
    assert stats.oversized_lines == 1
    assert stats.lines_read == 4


def test_giant_line_without_newline_does_not_grow_memory_without_bound():
    reader = LineReader(["ut of memory"], max_line=1024)
    for _ in range(100):
        list(reader.feed(b"B" * 100_000))
    assert len(reader._partial) == 1024
    assert reader.oversized_lines == 1


def test_minimal_literals_drop_the_ones_that_contain_another():
    assert minimal_literals(["ut of memory", "ut of memory happened", "Retract requests"]) == (
        b"ut of memory",
        b"Retract requests",
    )


def test_hyperscan_and_bytes_find_select_the_same_lines():
    finder = make_finder([b"ut of memory", b"Retract requests"])
    if finder.name != "hyperscan":
        pytest.skip("hyperscan is not installed on this platform; bytes.find is the only finder")
    data = (b"a" * 97 + b"ut of memory" + b"\n" + b"Retract requests x\n" + b"zz\n") * 50
    lines_of = lambda offsets: {data.rfind(b"\n", 0, o) for o in offsets}  # noqa: E731
    assert lines_of(finder.offsets(data, 0, len(data))) == lines_of(
        BytesFinder([b"ut of memory", b"Retract requests"]).offsets(data, 0, len(data))
    )
    assert lines_of(finder.offsets(data, 200, 900)) == lines_of(
        BytesFinder([b"ut of memory", b"Retract requests"]).offsets(data, 200, 900)
    )


def test_gzip_input_gives_the_same_events(tmp_path):
    import gzip

    plain = tmp_path / "a.log"
    plain.write_bytes(OOM * 2)
    packed = tmp_path / "a.log.1.gz"
    packed.write_bytes(gzip.compress(OOM * 2))
    from sglang_oom_exporter.scan.run import scan_paths

    result = scan_paths(CATALOG, [str(plain), str(packed)])
    assert [e.location for e in result.events] == [f"{plain}:1", f"{plain}:4", f"{packed}:1", f"{packed}:4"]


def test_invalid_utf8_is_replaced_not_fatal():
    data = b"\xff\xfe garbage \xc3\x28\n" + OOM.replace(b"batch", b"b\xffatch", 1) + OOM
    assert [e.kind for e in scan_bytes(data)] == ["prefill"]


@pytest.mark.parametrize("finder", ["hyperscan", "bytes.find"])
def test_other_service_lines_inside_a_block_are_counted_and_the_block_keeps_its_numbers(finder):
    if finder == "hyperscan":
        pytest.importorskip("hyperscan", reason="hyperscan has no wheel for this platform")
    foreign = b'webui-1   | INFO:     172.19.0.1:40112 - "GET /health HTTP/1.1" 200 OK\n'
    data = (
        b"sglang-1  | [2026-03-14 22:07:33] Decode out of memory. Try to lower your batch size.\n"
        + foreign * 20
        + b"sglang-1  | Try to allocate 8 tokens.\n"
        + foreign * 20
        + b"sglang-1  | Available tokens: 5 (available_size=5 + evictable_size=0)\n"
        + b"sglang-1  | \n"
        + b'sglang-1  | [2026-03-14 22:07:34] INFO:     127.0.0.1:41002 - "GET /health HTTP/1.1" 200 OK\n' * 3
        + foreign * 30
    )
    from sglang_oom_exporter.detect.pipeline import Pipeline

    events = []
    pipe = Pipeline(CATALOG, MATCHER, source="t", location="t.log", sink=events.append, finder=finder)
    pipe.feed(data)
    pipe.finish()
    assert [(e.kind, e.numbers["requested_tokens"], e.numbers["available_tokens"]) for e in events] == [
        ("decode", 8, 5)
    ]
    # The other service's lines inside the block are counted, never decoded; the block's blank line closes it, and
    # the lines after it are skipped as a gap.
    assert pipe._reader.quiet_lines == 40
    assert pipe.stats().lines_read == 77
    assert [e.excerpt for e in events] == [e.excerpt for e in scan_bytes(data, prefilter=False)]


@pytest.mark.parametrize("between", [0, 6, 300])
def test_a_cri_partial_record_keeps_the_lines_coming_until_its_full_record(between):
    # The decoder holds "stdout P" until its F: the anchor is cut in two, and neither piece holds the literal. While
    # the partial waits, the reader passes stdout's lines whatever the other stream writes in between.
    t = b"2026-03-14T22:07:33.1Z"
    head = b"".join(t + b" stdout F GET /%d 200\n" % i for i in range(20))
    data = head + t + b" stdout P [2026-03-14 22:07:33 TP0] Prefill out of mem\n"
    data += b"".join(t + b" stderr F step %d\n" % i for i in range(between))
    data += t + b" stdout F ory. Try to lower your batch size.\n" + t + b" stdout F Try to allocate 7 tokens.\n"
    data += b"".join(t + b" stdout F tail %d\n" % i for i in range(10))
    for prefilter in (False, True):
        got = [(e.kind, e.location, e.numbers) for e in scan_bytes(data, prefilter=prefilter)]
        assert got == [("prefill", "t.log:21", {"requested_tokens": 7})], prefilter


def test_a_record_whose_stream_went_quiet_is_closed_after_stale_lines_whatever_the_prefilter():
    # A CRI record open on stderr while stdout writes on: the reader offers stdout's lines, the pipeline needs none of
    # them; once stderr has written none of the last STALE_LINES lines, the record closes (line-counted, so reading
    # every line closes it at the same line), and the reader skips the rest instead of splitting every line.
    t = b"2026-03-14T22:07:33.1Z"
    data = t + b" stderr F [2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.\n"
    data += t + b" stderr F Try to allocate 7 tokens.\n"
    data += b"".join(t + b" stdout F GET /%d 200\n" % i for i in range(500))
    data += t + b" stderr F Available tokens: 5 (available_size=5 + evictable_size=0)\n"
    from sglang_oom_exporter.detect.assemble import STALE_LINES
    from sglang_oom_exporter.detect.pipeline import Pipeline

    events = []
    pipe = Pipeline(CATALOG, MATCHER, source="t", location="t.log", sink=events.append)
    pipe.feed(data)
    pipe.finish()
    assert pipe._reader.quiet_lines == STALE_LINES + 1 == 257  # lines 3-259: the record closes before line 259
    assert pipe.stats().lines_read == 503
    for got in (events, scan_bytes(data, prefilter=False)):
        assert [(e.kind, e.location, e.numbers) for e in got] == [("prefill", "t.log:1", {"requested_tokens": 7})]


def test_a_cri_partial_whose_full_record_never_comes_stops_holding_lines_after_a_bounded_run(monkeypatch):
    # A "stdout P" record whose F never comes (the container died mid-line) keeps the decoder waiting; past
    # MAX_UNNEEDED_RUN lines in a row the pipeline does not need, the reader cuts in with a gap and skips the rest.
    monkeypatch.setattr(reader_module, "MAX_UNNEEDED_RUN", 50)
    t = b"2026-03-14T22:07:33.1Z"
    data = t + b" stdout P [2026-03-14 22:07:33 TP0] Prefill out of mem\n"
    data += b"".join(t + b" stderr F step %d\n" % i for i in range(200))
    from sglang_oom_exporter.detect.pipeline import Pipeline

    pipe = Pipeline(CATALOG, MATCHER, source="t", location="t.log", sink=lambda e: None)
    pipe.feed(data)
    assert pipe._reader.quiet_lines == 50
    assert pipe.is_quiet()
    assert pipe.stats().lines_read == 201


def test_two_streams_records_open_at_once_each_keep_their_own_window():
    # Hypothesis's find: an OOM on stderr, then one on stdout whose lines used up the one window, so stderr's
    # record lost its "Try to allocate" line. Each stream now has its own window.
    t = b"2026-03-14T22:07:33.1Z"
    anchor = b" F [2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.\n"
    data = t + b" stderr" + anchor + t + b" stdout" + anchor + (t + b" stdout F \n") * 3
    data += t + b" stdout F step 1\n" + t + b" stderr F Try to allocate 96 tokens.\n"
    for prefilter in (False, True):
        got = sorted((e.location, e.numbers.get("requested_tokens")) for e in scan_bytes(data, prefilter=prefilter))
        assert got == [("t.log:1", 96), ("t.log:2", None)], prefilter


NOISE_SAMPLES = [b" 0 [] r=1", b"  12 [3, 4] r=2", b" 5 6 fr=1", b"[7] 8 fr=0", b" [9] 1 full_lock=2",
                 b"#tokens: 61420", b"#full_tokens: 5, #swa_tokens: 6", b"#full_tokens: 5, #mamba_num: 1"]  # fmt: skip


@pytest.mark.parametrize("line", NOISE_SAMPLES)
def test_the_assembler_skips_every_noise_line(line):
    from sglang_oom_exporter.detect.assemble import _NOISE

    assert _NOISE.match(line.decode()) is not None


@pytest.mark.parametrize("wrap", [b"", b"sglang-1  | ", b"2026-03-14T22:07:33.1Z stdout F "])
def test_noise_lines_a_record_skips_do_not_use_up_its_window(wrap):
    # Hypothesis's find: four radix-cache dump lines after an anchor used up its window; the assembler skips
    # such lines, so the record takes the detail line after them.
    lines = [b"[2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.", *[b" 0 [] r=1"] * 6,
             b"#tokens: 61420", b"Try to allocate 96 tokens."]  # fmt: skip
    data = b"".join(wrap + line + b"\n" for line in lines)
    for prefilter in (False, True):
        assert [(e.location, e.numbers) for e in scan_bytes(data, prefilter=prefilter)] == [
            ("t.log:1", {"requested_tokens": 96})
        ], prefilter


@pytest.mark.parametrize("noise", [0, 300])
def test_an_empty_cri_partial_ahead_of_an_anchor_starts_its_record_with_the_prefilter_too(noise):
    # "stdout P" with no text (a write that began with its newline) joins the next stdout record: the event's
    # first line is the partial's, as reading every line gives, even with other-stream lines in between.
    t = b"2026-03-14T22:07:33.1Z"
    head = b"".join(t + b" stdout F GET /%d 200\n" % i for i in range(5))
    between = b"".join(t + b" stderr F step %d\n" % i for i in range(noise))
    anchor = t + b" stdout F [2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.\n"
    data = head + t + b" stdout P\n" + between + anchor
    for prefilter in (False, True):
        got = [(e.kind, e.location, e.offset) for e in scan_bytes(data, prefilter=prefilter)]
        assert got == [("unknown", "t.log:6", len(head))], prefilter


@pytest.mark.parametrize(
    ("line", "stream"),
    [
        (b"2026-03-14T22:07:33.118204551Z stdout F 10.0.0.1 - GET /", "stdout"),
        (b"2026-03-14T22:07:33+01:00 stderr F", "stderr"),  # an empty record
        (b"2026-03-14T22:07:33Z stdout P Prefill out", None),  # a partial record joins the next
        (b"2026-03-14T22:07:33Z stdout P", None),
        (b"2026-03-14T22:07:33Z stdout Fx", ""),  # not a CRI record: a bare line
        (b"2026-03-14 stdout F not a time", ""),
        (b"2026-03-14T22:07:33Z stdout F text\r", "stdout"),
        (b"2026-03-14T22:07:33Z stdout F\r", ""),  # "$" does not match before a CR: the decoder's regex fails
        (b"2026-03-14T22:07:33.118Z [2026-03-14 22:07:33 TP0] Decode batch", ""),  # a CI timestamp
        (b'{"log":"x\\n","stream":"stdout"}', None),  # no time: not docker's own shape, the test cannot vouch
        (b'{"log":"Try to allocate 96 tokens.\\n","stream":"stderr","time":"2026-03-14T22:07:33Z"}', "stderr"),
        (b'{"log":"  File \\"/x.py\\", line 1, in \\u003cmodule\\u003e\\n","stream":"stdout","time":"t"}', "stdout"),
        (b'{"log":"bad \\x escape","stream":"stdout","time":"t"}', None),  # json.loads refuses it: a bare line
        (b'{"log":"x","stream":"stdin","time":"t"}', None),
        (b'{"level":"info"}', ""),
        (b"sglang-1  | 2026-03-14T22:07:33Z stdout F x", "sglang-1"),
        (b"sglang-1  | [2026-03-14 22:07:33 TP0] Out of memory.", "sglang-1"),
        (b"\x1b[36mopen-webui-1  |\x1b[0m INFO:     172.18.0.1:52144", None),  # coloured: the decoder decides
        (b"s\xc3\xa9rvice-1 | x", None),  # a non-ASCII name: str's \w takes it, bytes' does not
        (b"x" * 80 + b" | y", ""),  # the bar past the 80th character: no compose prefix
        (b"[2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.", ""),
        (b"2026-03-14 22:07:33.512 | INFO     | open_webui.main:chat:617 - done", ""),
        (b"sglang-1 exited with code 137", ""),  # compose's own status line: no service prefix
    ],
)
def test_stream_of_names_only_the_stream_the_decoder_reads_the_line_as(line, stream):
    assert stream_of(line) == stream
    decoded = Decoder().decode(RawLine(1, line))
    if stream is not None:
        assert decoded is not None
        assert decoded.stream == stream


_PARTS = [b"2026-03-14T22:07:33.1Z ", b"stdout ", b"stderr ", b"F ", b"P ", b"F", b'{"log":"', b'","stream":"',
          b'","time":"', b'"}', b"\\", b'\\"', b"\\u003c", b"sglang-1  ", b"| ", b"|", b"\x1b[36m", b"\xc3\xa9",
          b"\xff", b"\r", b" ", b"x", b"7", b"\t", b"\x00", b"2026-03-14T22:07:33.118Z ", b"> "]  # fmt: skip


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(_PARTS), max_size=12))
def test_stream_of_never_names_a_stream_the_decoder_does_not(parts):
    line = b"".join(parts)
    stream = stream_of(line)
    if stream is not None:
        decoded = Decoder().decode(RawLine(1, line))
        assert decoded is not None
        assert decoded.stream == stream


def test_while_busy_the_lines_the_stages_do_not_need_are_counted_not_passed():
    # A CUDA OOM traceback on stderr keeps the stages busy across stdout's lines; they need none of stdout's, so its
    # 40 lines are only counted, while stderr's own lines and every hit still pass (hits are never asked about).
    t = "2026-03-14T22:07:33.1Z"
    lines = [f"{t} stderr F Traceback (most recent call last):"]
    lines += [f"{t} stdout F GET /items/{i} 200" for i in range(20)]
    lines += [f'{t} stderr F   File "/workspace/train.py", line 88, in <module>', f"{t} stderr F     loss.backward()"]
    lines += [f"{t} stdout F GET /items/{i} 200" for i in range(20)]
    lines += [f"{t} stdout F Prefill out of memory.", f"{t} stderr F RuntimeError: boom"]
    asked: list[bytes] = []

    def needs(data: bytes) -> bool:
        asked.append(data.split()[1])
        return b" stderr " in data

    reader = LineReader(["ut of memory", "Traceback"], before=0, busy=lambda: True, needs=needs)
    items = [*reader.feed(("\n".join(lines) + "\n").encode()), *reader.finish()]
    assert [i.lineno for i in items if isinstance(i, RawLine)] == [1, 22, 23, 44, 45]
    assert reader.quiet_lines == 40
    assert not any(isinstance(i, Gap) for i in items)
    assert reader.lines_read == len(lines) == 45
    assert (asked.count(b"stdout"), asked.count(b"stderr")) == (40, 3)


def test_a_hit_line_passes_whole_even_when_the_stages_need_nothing():
    # A line holding a literal reaches the pipeline whatever it says (a usage line a later stage reads, say).
    line = b"2026-03-14T22:07:33.1Z stdout F [2026-03-14 22:07:35 TP0] Decode batch, #running-req: 3\n"
    reader = LineReader(["Decode batch"], busy=lambda: True, needs=lambda data: False)
    items = [*reader.feed(b"x\n" + line + b"y\n"), *reader.finish()]
    assert [(i.lineno, i.data) for i in items if isinstance(i, RawLine)] == [(2, line[:-1])]
    assert reader.quiet_lines == 2  # "x" and "y": offered (busy) and not needed
    assert not any(isinstance(i, Gap) for i in items)


def test_a_docker_json_frame_starts_its_headless_traceback_with_the_prefilter_too():
    # Docker writes a frame's quotes escaped ('.py\\", line '), so the frame literal must be searched in that form
    # too: a log cut mid-traceback starts its record at the first frame, as reading every line does.
    def docker(text: str) -> bytes:
        body = text.replace("\\", "\\\\").replace('"', '\\"').replace("<", "\\u003c").replace(">", "\\u003e")
        return b'{"log":"%s\\n","stream":"stderr","time":"2026-03-14T22:07:33.1Z"}\n' % body.encode()

    frame = '  File "/x/sglang/srt/mem_cache/allocation.py", line 9, in alloc_token_slots'
    data = docker("GET / 200") * 3 + docker(frame) + docker("    alloc()") + docker("GET / 200")
    for prefilter in (False, True):
        got = [(e.kind, e.location, e.offset, e.excerpt) for e in scan_bytes(data, prefilter=prefilter)]
        last_frame = "(last frame: alloc_token_slots in srt/mem_cache/allocation.py)"
        assert got == [("unknown", "t.log:4", 3 * len(docker("GET / 200")), last_frame)], prefilter
