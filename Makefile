.PHONY: demo test check lint bench-gateway

# Run the whole platform on the embedded default (PostgreSQL, gateway, analytics,
# model simulator) with simulated users. Ctrl-C stops it; data persists.
# Extra options: make demo ARGS="--gateway-port 9080 --users 500" (see liftgate up --help).
demo:
	@scripts/bootstrap
	.venv/bin/liftgate up --traffic $(ARGS)

# Everything the CI runs: install, start PostgreSQL and Kafka, lint, type-check, test.
test:
	@scripts/test

# The fast loop: lint, formatting, types and the pure-logic tests (no PostgreSQL, Kafka or
# started processes: tests marked `services` or `slow` are left to `make test`). Bytecode is
# written even where the environment says not to (PYTHONDONTWRITEBYTECODE): pytest then keeps
# each test module's rewritten asserts instead of rewriting them in every worker of every run
# (timings: bench/README.md).
check:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest -q -p no:cacheprovider -n auto -m "not services and not slow"

lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy
