# Newcomer entry points: `make demo` (proxy on embedded defaults) and `make test`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench redis venv

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev,demo]'
	touch $(STAMP)

venv: $(STAMP)

redis:
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || \
	  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
	    --logfile /tmp/cost-router-redis.log
	@for i in 1 2 3 4 5 6 7 8 9 10; do redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && exit 0; sleep 0.5; done; \
	  echo "redis did not start on 127.0.0.1:6379" >&2; exit 1

demo: $(STAMP)
	$(BIN)/cost-router serve

# pytest exits 5 when it collected no tests; make fails on any non-zero status, so that can't pass.
test: $(STAMP) redis
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/pip install -q -e '.[bench]'
	@echo "run the scripts in benchmarks/; results go to docs/benchmarks.md"
