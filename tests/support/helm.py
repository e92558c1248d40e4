"""The Helm chart through the real helm v4 binary: `template` (each distinct render once per run, a copy per call),
the documents picked out by kind, and the chart's paths.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.support.helpers import YAML_LOADER, once_per_run

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sglang-oom-exporter"
CI_FILES = sorted(p.name for p in (CHART / "ci").glob("*-values.yaml"))
RULES_FILE = CHART / "files" / "sglang-oom.rules.yaml"
SCHEMAS = ROOT / "tests" / "schemas"
CRD_SCHEMAS = {
    "ServiceMonitor": "servicemonitor-v1.json",
    "PodMonitor": "podmonitor-v1.json",
    "PrometheusRule": "prometheusrule-v1.json",
}


@functools.cache
def _crd_validator(kind: str) -> jsonschema.protocols.Validator:
    """The vendored CRD schema for kind, checked and compiled once (jsonschema.validate re-checks it per call)."""
    schema = json.loads((SCHEMAS / CRD_SCHEMAS[kind]).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def crd_validate(doc: dict) -> None:
    """What jsonschema.validate does (raise the best-matching error) with the cached validator."""
    error = jsonschema.exceptions.best_match(_crd_validator(doc["kind"]).iter_errors(doc))
    if error is not None:
        raise error


def helm() -> str:
    """The helm v4 binary: .tools/bin/helm (tools/install-helm.sh), else one on PATH; skips without one."""
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if found is None:
        pytest.skip("helm v4 is not installed (tools/install-helm.sh puts it in .tools/bin)")
    return found


def run_tool(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A tool's run (text output, a minute at most); the caller checks its returncode."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)


def helm_with_values(
    argv: list[str], ci: tuple[str, ...], values: dict | None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run helm with the ci files, then the extra values (a dict, passed as one more values file)."""
    for name in ci:
        argv += ["-f", str(CHART / "ci" / name)]
    with tempfile.TemporaryDirectory() as tmp:
        if values is not None:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(values))
            argv += ["-f", str(path)]
        return run_tool(*argv, env=env)


@functools.cache
def _template_once(
    ci: tuple[str, ...], values_json: str | None, release: str = "t", namespace: str = "monitoring"
) -> tuple[int, str, tuple[dict, ...]]:
    """One `helm template` per distinct input in this process: (returncode, stderr, documents).

    The ci files' renders, which most tests and kubernetes-validate read, are rendered once per run."""

    def render() -> tuple[int, str, list[dict]]:
        values = None if values_json is None else json.loads(values_json)
        proc = helm_with_values([helm(), "template", release, str(CHART), "-n", namespace], ci, values)
        docs = [d for d in yaml.load_all(proc.stdout, Loader=YAML_LOADER) if d] if proc.returncode == 0 else []
        return proc.returncode, proc.stderr, docs

    default_release = (release, namespace) == ("t", "monitoring")
    if default_release and values_json is None and len(ci) == 1 and ci[0] in CI_FILES:
        returncode, stderr, docs = once_per_run(f"helm-template-{ci[0]}", render)
    else:
        returncode, stderr, docs = render()
    return returncode, stderr, tuple(docs)


def template(*ci: str, values: dict | None = None, ok: bool = True, release: str = "t", namespace: str = "monitoring"):
    """helm template (release t, namespace monitoring unless given): the documents, or helm's error when ok is False."""
    # Rendered once per input and handed out as a deep copy, so a test that edits its documents edits only its own.
    values_json = None if values is None else json.dumps(values, sort_keys=True)
    returncode, stderr, docs = _template_once(ci, values_json, release, namespace)
    if ok:
        assert returncode == 0, stderr
        return copy.deepcopy(list(docs))
    assert returncode != 0, "helm template should have failed"
    return stderr


def by_kind(docs, kind):
    """The documents of one kind."""
    return [d for d in docs if d["kind"] == kind]


def one(docs, kind):
    """The one document of a kind (fails if there are more or none)."""
    found = by_kind(docs, kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def workload(docs):
    """The DaemonSet or Deployment that runs the exporter."""
    (pod_owner,) = [d for d in docs if d["kind"] in ("DaemonSet", "Deployment")]
    return pod_owner


def rendered_config(docs) -> dict:
    """The exporter's config.yaml as the chart renders it into its ConfigMap."""
    cm = next(d for d in by_kind(docs, "ConfigMap") if "config.yaml" in d["data"])
    return yaml.safe_load(cm["data"]["config.yaml"])


def needs_rules():
    """Skip unless the chart's copy of the rules file is rendered."""
    if not RULES_FILE.is_file():
        pytest.skip("the chart's copy of the rules file is not rendered yet (run sglang-oom-exporter render)")


def needs_dashboards():
    """Skip unless the chart's dashboards are rendered."""
    if not list((CHART / "files" / "dashboards").glob("*.json")):
        pytest.skip("the chart's dashboards are not rendered yet (run sglang-oom-exporter render)")


def install_notes(*ci: str, values: dict | None = None) -> str:
    """NOTES.txt as `helm install --dry-run=client` prints it (no cluster needed)."""
    proc = helm_with_values([helm(), "install", "t", str(CHART), "-n", "monitoring", "--dry-run=client"], ci, values)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split("NOTES:\n", 1)[1]
