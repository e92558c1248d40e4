"""The chart README's sidecar snippet, as the tests take it: the pod, and its SGLang container's script with a
stand-in program in place of `python3 -m sglang.launch_server …`."""

from __future__ import annotations

import re
from typing import Any

import yaml

from tests.support.helm import CHART

LOG = "/var/log/sglang/sglang.log"


def snippet_pod() -> dict[str, Any]:
    """The pod of the chart README's sidecar snippet (between the two `<!-- sidecar-snippet -->` markers)."""
    text = (CHART / "README.md").read_text()
    snippet = text.split("<!-- sidecar-snippet -->", 2)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    pod: dict[str, Any] = yaml.safe_load(snippet)
    return pod


def container(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """The pod's container of that name."""
    (found,) = [c for c in pod["spec"]["containers"] if c["name"] == name]
    return found


def with_stand_in(script: str, stand_in: str) -> str:
    """The SGLang container's script with `stand_in` (a shell command) run where SGLang's launch_server is: its
    output still goes into the snippet's own pipe."""
    replaced, count = re.subn(r"python3 -m sglang\.launch_server .*?(?=> \"\$pipe\" 2>&1 &)", stand_in + " ",
                              script, flags=re.S)  # fmt: skip
    assert count == 1, script
    return replaced


def env(c: dict[str, Any]) -> dict[str, str]:
    """A container's literal env values."""
    return {e["name"]: e["value"] for e in c.get("env", [])}
