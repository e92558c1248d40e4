# The edit loop and CI in one place. `make all` is what tools/test.sh (README's test command) and CI run.
#   make lint          ruff, ruff format --check, mypy --strict (pyproject's settings)
#   make test          the pure-Python tests, no slow or end-to-end ones: the edit loop (CONTRIBUTING has its
#                      measured time), one worker per CPU: nothing in it waits on another program, and each
#                      worker costs a collection of the suite (about 4 s of CPU)
#   make e2e           the tests that start promtool, Prometheus, Alertmanager, podman, chromium, helm, mtail or
#                      the daemon (pytest marker e2e; their machine packages missing: they skip and say why)
#   make live-sglang   the tests that run a real SGLang 0.5.23 on the CPU against the daemon (pytest marker live_sglang,
#                      also e2e); the first run installs it into .cache/live-sglang/ (4-7 minutes, 2.8 GB);
#                      `$(PYTHON) -m tests.support.live_sglang record` re-records tests/data's real fixtures;
#                      part of `make all` (CI, `.ci/run`), not of `make e2e`; its pinned CPU torch is the one this
#                      machine kind keeps on disk, so the hosted workflow runs `make all ALL_MARKERS="not lint and not live_sglang"`
#   make render-check  the generated files equal a fresh render of the catalog and code
#   make image         the container image (docker or podman; BASE_IMAGE=... to build on another base)
#   make all           lint, render-check, then the whole suite (the lint tests excluded: lint ran first)
#   make sglang-wheel  the wheel of the SGLang release the newest tools/sglang-texts inventory pins, into
#                      .cache/sglang-wheels (once; tests/test_sglang_texts.py reads it, and skips without it)
# PYTHON picks the interpreter (tools/test.sh passes its own); PYTEST_ARGS go to every pytest run.

PYTHON ?= python3
PYTEST_ARGS ?=
ALL_MARKERS ?= not lint
LINT_PATHS := exporter tests bench tools
PYTEST := $(PYTHON) -m pytest -q -n auto --dist worksteal $(PYTEST_ARGS)
CPUS := $(shell $(PYTHON) -c 'import os; print(len(os.sched_getaffinity(0)))' 2>/dev/null || echo auto)
CONTAINER ?= $(shell command -v podman || command -v docker)
VERSION := $(shell sed -n 's/^__version__ = "\(.*\)"$$/\1/p' exporter/__init__.py)
IMAGE ?= sglang-oom-exporter:$(VERSION)
BASE_IMAGE ?=

SGLANG_TEXTS := $(lastword $(shell ls tools/sglang-texts/*.yaml | sort -V))
SGLANG_RELEASE := $(shell sed -n 's/^release: //p' $(SGLANG_TEXTS))

.PHONY: all lint test e2e live-sglang render-check image sglang-wheel

all: lint render-check
	$(PYTEST) -m "$(ALL_MARKERS)"

lint:
	$(PYTHON) -m ruff check $(LINT_PATHS)
	$(PYTHON) -m ruff format --check $(LINT_PATHS)
	$(PYTHON) -m mypy

test:
	$(PYTEST) -n $(CPUS) -m "not e2e and not slow and not lint"

e2e:
	$(PYTEST) -m "e2e and not live_sglang"

live-sglang:
	$(PYTEST) -m "live_sglang"

render-check:
	$(PYTHON) -m sglang_oom_exporter render --check

image:
	$(CONTAINER) build -t $(IMAGE) --build-arg VERSION=$(VERSION) $(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE)) .

sglang-wheel:
	@ls .cache/sglang-wheels/sglang-$(SGLANG_RELEASE)-*.whl >/dev/null 2>&1 || \
		$(PYTHON) -m pip download --disable-pip-version-check -q --no-deps --only-binary=:all: \
		"sglang==$(SGLANG_RELEASE)" -d .cache/sglang-wheels
