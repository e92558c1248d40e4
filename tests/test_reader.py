"""The prefiltering reader: line accounting, giant lines, and both literal finders agreeing."""

from __future__ import annotations

import io

import pytest

from sglang_oom_exporter.detect.decode import Decoder, cri_full_stream, wrapper_stream
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


def test_every_line_is_either_passed_or_counted_in_a_gap():
    filler = b"".join(b"[2026-03-14 22:07:3%d TP0] Decode batch, #running-req: 1\n" % (i % 10) for i in range(5000))
    data = filler + OOM + filler + b"no newline at the end"
    reader = LineReader(["ut of memory"], after_short=2, before=3)
    items = _drain(reader, [data])
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


@pytest.mark.parametrize(
    ("line", "stream"),
    [
        (b"sglang-1  | [2026-03-14 22:07:33 TP0] Out of memory.", b"sglang-1"),
        (b"\x1b[36mopen-webui-1  |\x1b[0m INFO:     172.18.0.1:52144", b"open-webui-1"),
        (b"2026-03-14T22:07:33.118204551Z stderr F Try to allocate 96 tokens.", b"stderr"),
        (b'{"log":"Try to allocate 96 tokens.\\n","stream":"stdout","time":"2026-03-14T22:07:33Z"}', b"stdout"),
        (b"[2026-03-14 22:07:33 TP0] Out of memory. Try to lower your batch size.", None),
        (b"Available tokens: 40 (available_size=40 + evictable_size=0)", None),
        (b"2026-03-14 22:07:33.512 | INFO     | open_webui.main:chat:617 - done", None),
    ],
)
def test_wrapper_stream_names_the_compose_service_or_the_runtime_stream(line, stream):
    assert wrapper_stream(line) == stream


@pytest.mark.parametrize("finder", ["hyperscan", "bytes.find"])
def test_other_service_lines_inside_a_block_neither_use_up_nor_extend_the_window(finder):
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
    reader = LineReader(["ut of memory"], extenders=["Try to allocate", "vailable"], finder=finder, before=0)
    items = _drain(reader, [data])
    passed = [i.lineno for i in items if isinstance(i, RawLine)]
    # The other service's lines neither close the window (the details pass) nor keep it open once
    # sglang-1's own lines have used it up: the last 30 are skipped.
    assert passed == list(range(1, 48))
    assert sum(i.lines for i in items if isinstance(i, Gap)) == 30
    events = scan_bytes(data)
    assert [(e.kind, e.numbers["requested_tokens"], e.numbers["available_tokens"]) for e in events] == [
        ("decode", 8, 5)
    ]


@pytest.mark.parametrize("opener_searched", [False, True])
def test_an_open_cri_span_holds_the_window_whether_or_not_its_opener_is_a_searched_literal(opener_searched):
    # The reader skips the span check on lines that are not hits only when every span opener is a searched
    # literal (then the line opening a span is a hit); otherwise it must check every line in the window.
    t = "2026-03-14T22:07:33.1Z"
    lines = [f"{t} stdout F noise {i}" for i in range(20)]
    lines += [f"{t} stdout F Prefill out of memory.", f"{t} stdout P part one"]
    lines += [f"{t} stderr F other {i}" for i in range(6)]
    lines += [f"{t} stdout F end of line", *(f"{t} stdout F tail {i}" for i in range(10))]
    literals = ["ut of memory", " stdout P "] if opener_searched else ["ut of memory"]
    reader = LineReader(literals, spans=[(" stdout P ", " stdout F ")], after_short=1)
    assert reader._openers_hit is opener_searched
    items = [*reader.feed(("\n".join(lines) + "\n").encode()), *reader.finish()]
    # The anchor (21), the P record (22), the six other-stream lines the open span holds (23-28), its F (29).
    assert [i.lineno for i in items if isinstance(i, RawLine)] == list(range(21, 30))
    assert sum(i.lines for i in items if isinstance(i, Gap)) == len(lines) - 9


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
def test_every_noise_line_the_assembler_skips_passes_both_of_the_readers_tests(line):
    import regex

    from sglang_oom_exporter.detect.assemble import _NOISE, NOISE_IN_RAW, NOISE_LINES

    assert _NOISE.match(line.decode()) is not None
    quick, full = NOISE_IN_RAW
    assert quick.search(b"x | " + line) is not None
    assert full.search(b"x | " + line) is not None
    (lit,) = {lit for rx, lit in NOISE_LINES if regex.match(rx, line.decode())}
    assert lit.encode() in line


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
        (b"2026-03-14T22:07:33Z stdout Fx", None),
        (b"2026-03-14 stdout F not a time", None),
        (b"2026-03-14T22:07:33Z stdout F text\r", "stdout"),
        (b"2026-03-14T22:07:33Z stdout F\r", None),  # "$" does not match before a CR: the decoder's regex fails
        (b'{"log":"x\\n","stream":"stdout"}', None),
        (b"sglang-1  | 2026-03-14T22:07:33Z stdout F x", None),
    ],
)
def test_cri_full_stream_names_only_what_the_decoder_reads_as_that_streams_full_record(line, stream):
    assert cri_full_stream(line) == stream
    decoded = Decoder().decode(RawLine(1, line))
    if stream is not None:
        assert decoded is not None
        assert decoded.stream == stream


def test_a_quiet_streams_lines_in_the_window_are_counted_not_passed():
    # A CUDA OOM traceback on stderr holds the window open across stdout's lines; stdout has nothing open
    # downstream, so its 40 lines are only counted, while stderr's own lines and every hit still pass.
    t = "2026-03-14T22:07:33.1Z"
    lines = [f"{t} stderr F Traceback (most recent call last):"]
    lines += [f"{t} stdout F GET /items/{i} 200" for i in range(20)]
    lines += [f'{t} stderr F   File "/workspace/train.py", line 88, in <module>', f"{t} stderr F     loss.backward()"]
    lines += [f"{t} stdout F GET /items/{i} 200" for i in range(20)]
    lines += [f"{t} stdout F Prefill out of memory.", f"{t} stderr F RuntimeError: boom"]
    asked: list[str] = []

    def quiet(stream: str) -> bool:
        asked.append(stream)
        return stream == "stdout"

    reader = LineReader(
        ["ut of memory", "Traceback"], openers=["Traceback"], extenders=['File "'], before=0, quiet=quiet
    )
    items = [*reader.feed(("\n".join(lines) + "\n").encode()), *reader.finish()]
    assert [i.lineno for i in items if isinstance(i, RawLine)] == [1, 22, 23, 44, 45]
    assert reader.quiet_lines == 40
    assert not any(isinstance(i, Gap) for i in items)
    assert reader.lines_read == len(lines) == 45
    assert (asked.count("stdout"), asked.count("stderr")) == (40, 3)  # hits are never asked about
