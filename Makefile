# The two commands a new user needs are `make serve` (later) and `make test`;
# each installs what it needs first.
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: test lint format unit bench host-tools kubectl clean

$(INSTALLED): pyproject.toml scripts/bootstrap
	VENV=$(VENV) scripts/bootstrap
	touch $@

## test: lint, type-check, the import contracts and the whole suite
test: lint unit

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: $(INSTALLED) host-tools kubectl
	$(BIN)/pytest

host-tools:
	scripts/host-tools

## kubectl: the pinned kubectl the kubectl tests drive, into .tools/bin (x86_64 only)
kubectl: host-tools
	scripts/get-kubectl

## format: rewrite the code in the project's style
format: $(INSTALLED)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

## bench: every benchmark, as one table
bench: $(INSTALLED) host-tools
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
