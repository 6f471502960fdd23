# The two commands of the README:  `make demo`  and  `make test`.
# Everything else here is a step they depend on; each step is skipped when up to date.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMPS := .stamps
export PATH := $(CURDIR)/$(BIN):$(PATH)
# pip install, without a local package mirror's "Location ... is ignored" noise; pipefail keeps pip's status.
PIP = set -o pipefail; $(BIN)/python -m pip install -q
QUIET = 2>&1 | { grep -v '^WARNING: Location' || true; }

.PHONY: demo test test-fast test-server test-faults setup artifacts clean

demo: artifacts
	$(BIN)/ragstack demo

# Every tier: what CI runs. Two workers, a file's tests on one of them, each worker with a session server of
# its own: the server tiers wait on processes about half the time, so the second core fills that
# (about 11 min instead of 17.5 on 2 cores).
test: artifacts $(STAMPS)/node
	$(BIN)/python -m pytest -ra -n 2 --dist loadfile $(PYTEST_ARGS)

# The edit loop: unit and engine-on-CPU tests, no server, not those marked slow (processes started,
# kernels compiled for a GPU, and in Triton's CPU interpreter all but a few cases of each kernel test's
# grid and of the model's runs: tests/engine/tiers.py), on every core, torch's threads shared out among
# the workers (tests/conftest.py); about 40 s on 2 cores;
# a file's tests stay on one worker, in order (module fixtures hold engines and process groups).
test-fast: artifacts
	$(BIN)/python -m pytest -q -n auto --dist loadfile -p no:cacheprovider -m 'not slow' tests/unit tests/engine $(PYTEST_ARGS)

# The real server: the session server and servers of their own; then killed processes, overload, load cycles.
test-server: artifacts $(STAMPS)/node
	$(BIN)/python -m pytest -ra tests/server $(PYTEST_ARGS)

test-faults: artifacts
	$(BIN)/python -m pytest -ra tests/faults $(PYTEST_ARGS)

setup: $(STAMPS)/venv $(STAMPS)/node

# The venv: pinned dependencies, the project in editable mode, and the system library the
# Python backend stub links against (Debian's libpython for the venv's Python).
$(STAMPS)/venv: requirements.lock requirements-lm-eval.lock requirements-client-libs.lock pyproject.toml \
		scripts/setup_system.sh
	bash scripts/setup_system.sh $(PYTHON)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip $(QUIET)
	$(PIP) -r requirements.lock $(QUIET)
	$(PIP) --no-deps -r requirements-lm-eval.lock $(QUIET)
	$(PIP) --no-deps -r requirements-client-libs.lock $(QUIET)
	$(PIP) --no-deps --no-build-isolation -e . $(QUIET) >/dev/null
	@mkdir -p $(STAMPS) && touch $@

# The official openai Node SDK, pinned, for its request flows against the frontend (tests/node_client).
$(STAMPS)/node: tests/node_client/package.json tests/node_client/package-lock.json
	npm ci --prefix tests/node_client --no-audit --no-fund --loglevel=error
	@mkdir -p $(STAMPS) && touch $@

# Built artifacts (ONNX models, tiny checkpoints, indexes); `ragstack build` skips what is up to date.
artifacts: $(STAMPS)/venv
	$(BIN)/ragstack build

clean:
	rm -rf $(VENV) $(STAMPS)
