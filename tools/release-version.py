#!/usr/bin/env python3
"""Print the version a release tag publishes, after checking that every place that names it agrees.

    tools/release-version.py v0.1.0    # prints 0.1.0, or names each mismatch and exits 1

The tag (v<version>), the package version (exporter/__init__.py's __version__, which pyproject.toml reads) and the
chart's Chart.yaml `version` and `appVersion` must be the same string: the release workflow pushes the image with
that tag and the chart with that version, and the chart's image tag defaults to its appVersion. CHANGELOG.md's
newest section must be that version's, dated: `## <version> / YYYY-MM-DD` (`## <version> / unreleased` until the
release commit dates it). Standard library only, so it runs before anything is installed.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def package_version() -> str:
    """__version__ from exporter/__init__.py, read without importing the package."""
    tree = ast.parse((ROOT / "exporter" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return str(ast.literal_eval(node.value))
    raise SystemExit("release-version: no __version__ in exporter/__init__.py")


def chart_versions() -> dict[str, str]:
    """Chart.yaml's top-level version and appVersion (quotes removed)."""
    text = (ROOT / "helm" / "sglang-oom-exporter" / "Chart.yaml").read_text()
    found = dict(re.findall(r'^(version|appVersion):\s*"?([^"\s]+)"?\s*$', text, re.M))
    return {key: found.get(key, "(missing)") for key in ("version", "appVersion")}


SECTION = re.compile(r"^## (\S+) / (\S+)$", re.M)


def changelog_problem(version: str) -> str | None:
    """Why CHANGELOG.md does not release this version, or None."""
    path = ROOT / "CHANGELOG.md"
    if not path.is_file():
        return "CHANGELOG.md is missing"
    found = SECTION.search(path.read_text())
    if found is None:
        return "CHANGELOG.md has no version section (## <version> / <date>)"
    newest, when = found.groups()
    if newest != version:
        return f"CHANGELOG.md's newest section is {newest}, not {version}"
    if when == "unreleased":
        return f"CHANGELOG.md's {version} section is marked unreleased: date it (## {version} / YYYY-MM-DD)"
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", when):
        return f"CHANGELOG.md's {version} section is dated {when!r}, not YYYY-MM-DD"
    return None


def main(argv: list[str]) -> int:
    """Check the tag against the sources; print the version."""
    if len(argv) != 1:
        print("usage: tools/release-version.py TAG", file=sys.stderr)
        return 2
    tag = argv[0].removeprefix("refs/tags/")
    version = package_version()
    pyproject = (ROOT / "pyproject.toml").read_text()
    problems = []
    if 'version = { attr = "sglang_oom_exporter.__version__" }' not in pyproject:
        problems.append("pyproject.toml no longer reads its version from sglang_oom_exporter.__version__")
    if tag != f"v{version}":
        problems.append(f"tag {tag} is not v{version} (the package version)")
    for key, value in chart_versions().items():
        if value != version:
            problems.append(f"Chart.yaml {key} is {value}, not {version} (run `sglang-oom-exporter render`)")
    problem = changelog_problem(version)
    if problem is not None:
        problems.append(problem)
    for problem in problems:
        print(f"release-version: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(version)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
