"""An event excerpt never carries a logged request's prompt or output text (daemon/redact.py via the sink)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sglang_oom_exporter.events.redact import REDACTED, redact_excerpt, redact_line

SECRET = "SECRET-PROMPT"  # noqa: S105 - request text a test plants, not a password


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        # --log-requests: the request on arrival and on finish
        (f"[2026-03-14 22:07:30] Receive: obj=GenerateReqInput(text='{SECRET}', rid='a1')", "Receive: obj="),
        (f"[2026-03-14 22:07:31] Finish: obj=GenerateReqInput(rid='a1'), out={{'text': '{SECRET}'}}",
         "Finish: obj="),
        # a request object quoted in an exception message or a traceback's code line
        (f"RuntimeError: bad batch req=Req(rid=a1, origin_input_text='{SECRET}')", "RuntimeError: bad batch req=Req("),
        (f"    self.process(GenerateReqInput(text='{SECRET}'))", "    self.process(GenerateReqInput("),
        (f"ValueError: input_ids=[101, 2023] prompt='{SECRET}'", "ValueError: input_ids="),
        # a JSON body in a log line
        (f'INFO: body={{"model": "m", "messages": [{{"role": "user", "content": "{SECRET}"}}]}}',
         'INFO: body={"model": "m", "messages":'),
        # an access log line with the prompt in its query string
        (f'INFO:     127.0.0.1:5432 - "GET /generate?text={SECRET} HTTP/1.1" 200 OK', 'INFO:     127.0.0.1:5432 - "GET /generate?'),
    ],
)  # fmt: skip
def test_request_text_is_cut_and_what_precedes_it_stays(line, kept):
    out = redact_line(line)
    assert SECRET not in out
    assert out.startswith(line[: line.index(kept) + len(kept)])
    assert REDACTED in out


@pytest.mark.parametrize(
    "line",
    [
        "[2026-03-14 22:07:33 TP0] Prefill out of memory. Try to lower your batch size.",
        "Try to allocate 16384 tokens.",
        "(last frame: forward in srt/model_executor/model_runner.py)",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 1.2 GiB is free.",
        "KV cache pool is full. Retract requests. #retracted_reqs: 2, #new_token_ratio: 0.4000 -> 0.5000",
        'INFO:     127.0.0.1:5432 - "POST /generate HTTP/1.1" 200 OK',
        "context_length=32768 chunked_prefill_size=16384",
    ],
)
def test_lines_without_request_text_are_untouched(line):
    assert redact_line(line) == line
    assert redact_excerpt(f"{line}\n{line}") == f"{line}\n{line}"


def test_scan_json_excerpt_of_a_cuda_oom_quoting_the_request_has_no_request_text(tmp_path):
    # The exception message of a CUDA OOM traceback quotes the request: the excerpt is that traceback's end.
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-03-14 22:07:33 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/sglang/srt/model_executor/model_runner.py", line 9, in forward\n'
        "    x()\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        f"79.15 GiB of which 1.2 GiB is free. Request: obj=GenerateReqInput(text='{SECRET}', rid='a1')\n\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_oom_exporter", "scan", "--format", "json", str(log)],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    (event,) = json.loads(proc.stdout)["events"]
    assert event["kind"] == "cuda_oom"
    assert SECRET not in proc.stdout
    assert event["excerpt"].endswith("1.2 GiB is free. Request: obj=" + REDACTED)
    assert event["message"].endswith("1.2 GiB is free. Request: obj=" + REDACTED)
