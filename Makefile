# Newcomer entry points: `make demo` (proxy on embedded defaults) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench redis venv promtool

# llama-cpp-python compiles llama.cpp from source. Its default build targets the build machine's
# own CPU (GGML_NATIVE), and on VMs whose CPU flags list AMX/AVX-512 that the hypervisor does not
# allow, the server dies with SIGILL on its first completion. So we build one portable (AVX2) wheel
# into a cache outside the checkout and install from it; pip's own wheel cache would otherwise
# hand back a native build.
LLAMA_VERSION := 0.3.36
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF
WHEELS ?= $(HOME)/.cache/cost-router/wheels

# One resolved set of versions for every extra together (dev, demo, bench, data, otel): each
# install below is constrained by it, so `make bench` can never change what `make lint` and
# `make test` run on, and pip has nothing to search. Regenerate it after changing a requirement:
# see the head of constraints.txt (checked by tests/test_constraints.py).
CONSTRAINTS := constraints.txt
PIP_INSTALL := $(BIN)/pip install -q -c $(CONSTRAINTS)

# `distill` (torch CPU build, transformers, peft, gguf) is in the test set for the distillation
# test (tests/router/learning/test_distill_train.py): about 2.5 min and 1.1 GB more on a fresh
# venv here, torch's wheel coming from the machine's disk.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	ls $(WHEELS)/llama_cpp_python-$(LLAMA_VERSION)-*.whl >/dev/null 2>&1 || \
	  CMAKE_ARGS="$(LLAMA_CMAKE)" $(BIN)/pip wheel -q --no-deps --no-cache-dir -w $(WHEELS) \
	    'llama-cpp-python==$(LLAMA_VERSION)'
	$(PIP_INSTALL) --find-links $(WHEELS) 'llama-cpp-python[server]==$(LLAMA_VERSION)' \
	  -e '.[dev,demo,distill]'
	touch $(STAMP)

venv: $(STAMP)

redis:
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || \
	  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
	    --logfile /tmp/cost-router-redis.log
	@for i in 1 2 3 4 5 6 7 8 9 10; do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && exit 0; sleep 0.5; done; \
	  echo "redis did not start on 127.0.0.1:6379" >&2; exit 1

# promtool checks and unit-tests router/observability/monitoring/alerts.yml (tests/router/observability/test_alert_rules.py).
# It ships in Debian's `prometheus` package, whose install may start a Prometheus server on :9090:
# stopped and disabled again, as only the tool is wanted.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
	  { DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus || \
	    { apt-get update -q && \
	      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; }; } && \
	  { systemctl disable --now prometheus >/dev/null 2>&1 || \
	    service prometheus stop >/dev/null 2>&1 || true; }; }
	@command -v promtool >/dev/null 2>&1 || { echo "promtool not found (apt-get install prometheus)" >&2; exit 1; }

# `make demo PORT=9080 SMALL_PORT=9101 LARGE_PORT=9102` moves the proxy and the two tier servers
# (PORT=0: any free ports); unset, 8080, 8101 and 8102.
comma := ,
demo: $(STAMP)
	$(BIN)/cost-router serve $(if $(PORT),--port $(PORT)) \
	  $(if $(SMALL_PORT)$(LARGE_PORT),--tier-ports $(or $(SMALL_PORT),8101)$(comma)$(or $(LARGE_PORT),8102))

# pytest exits 5 when it collected no tests; make fails on any non-zero status, so that can't pass.
test: $(STAMP) redis promtool
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

bench: $(STAMP)
	$(PIP_INSTALL) --find-links $(WHEELS) -e '.[bench]'
	@echo "run the scripts in benchmarks/; results go to docs/benchmarks.md"
