# The two commands a new user needs are `make serve` and `make test`; each installs what it
# needs first. While editing, `make check` is the quick loop (under two minutes).
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: serve test check lint complexity format unit pure bench host-tools kubectl kube-tools e2b-clients clean

$(INSTALLED): pyproject.toml testing/pyproject.toml constraints.txt scripts/bootstrap
	VENV=$(VENV) scripts/bootstrap
	touch $@

## serve: a whole one-host development fleet (as root): e2b API :3000, Kubernetes API :3002,
## host agent :7777, state in ./.sandboxctl. More flags: make serve SERVE_ARGS="--pool base=4"
serve: $(INSTALLED) host-tools
	@[ "$$(id -u)" = 0 ] || { echo "make serve: the sandbox runtime runs as root: try sudo make serve" >&2; exit 2; }
	$(BIN)/sandboxctl serve $(SERVE_ARGS)

## test: lint, type-check, the import contracts, the complexity budget and the whole suite
test: lint unit

## check: what `make test` checks but the suite's slow half: lint and the pure tests
## (no root, namespaces, network or spawned services; see the markers in pyproject.toml)
check: lint pure

lint: $(INSTALLED) complexity
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

## complexity: no function in sandboxctl/ above cyclomatic complexity 20 as radon counts
## it (rank C ends at 20). xenon skips nested functions, so radon lists those itself.
complexity: $(INSTALLED)
	$(BIN)/xenon --max-absolute C sandboxctl
	@! $(BIN)/radon cc --show-closures --min D sandboxctl | grep . || \
	    { echo "complexity: the functions above are over 20" >&2; exit 1; }

## unit: the suite, on two workers (pytest-xdist; tests/conftest.py groups the tests that
## share a stack, so one worker starts it). One worker: make unit PYTEST_ARGS=
PYTEST_ARGS ?= -n 2 --dist loadgroup
unit: $(INSTALLED) host-tools kubectl kube-tools e2b-clients
	$(BIN)/pytest $(PYTEST_ARGS)

## pure: the tests that need none of root, namespaces, network or spawned services
PURE_TESTS ?= not root and not netns and not services
pure: $(INSTALLED)
	$(BIN)/pytest -q -m "$(PURE_TESTS)" $(PYTEST_ARGS)

host-tools:
	scripts/host-tools

## kubectl: the pinned kubectl the kubectl tests drive, into .tools/bin (x86_64 only)
kubectl: host-tools
	scripts/get-kubectl

## kube-tools: etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok, karpenter-kwok
## and helm, built from the Go modules pinned under tools/ into .tools/bin (only what is missing
## or whose module changed; needs Go; the Go caches stay outside the checkout), for the real
## control plane every Kubernetes test runs on; and kwok's stages and Karpenter's CRDs, copied
## from the same modules into .tools/share and .tools/crds. A cold build: about 15 min on 2 cores.
kube-tools:
	scripts/build-kube-tools

## e2b-clients: the client matrix's JS SDK, CLI and newest Python SDK, into a cache outside
## the checkout (SANDBOXCTL_CLIENT_CACHE, default ~/.cache/sandboxctl/e2b-clients)
e2b-clients: $(INSTALLED)
	PYTHON=python3 scripts/get-e2b-clients

## format: rewrite the code in the project's style
format: $(INSTALLED)
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

## bench: every benchmark, as one table
bench: $(INSTALLED) host-tools
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
