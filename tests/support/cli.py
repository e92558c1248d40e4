"""The command line run in this process: `cli` calls cli.main() like the command (stdin from bytes, the exit code
and the output back), about 0.3 s of CPU cheaper than a subprocess per call."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable

import pytest

from sglang_oom_exporter.cli import main


@pytest.fixture
def cli(
    capsysbinary: pytest.CaptureFixture[bytes], monkeypatch: pytest.MonkeyPatch
) -> Callable[..., subprocess.CompletedProcess[bytes]]:
    """Run cli.main() in this process like the command: stdin from bytes, the exit code and the output back."""

    def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
        capsysbinary.readouterr()  # only this run's output
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
        code = main(list(args))
        out, err = capsysbinary.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return run
