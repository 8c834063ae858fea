# tirl: `make demo` and `make test` each install what they need first (idempotent, quick when done).
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.tirl-installed
# The CPU build of torch; on this kind of machine pip takes it from local disk. Override on GPU machines.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		echo "GPU found: installing torch from the package's dependencies"; \
	else \
		$(PY) -m pip install -qq --disable-pip-version-check "$(TORCH_SPEC)"; \
	fi
	$(PY) -m pip install -qq --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: install
	$(VENV)/bin/tirl demo

test: install
	$(PY) -m pytest -q

test-fast: install
	$(PY) -m pytest -q -m "not slow"

lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

bench: install
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
