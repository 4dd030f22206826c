"""Test doubles for sandboxctl, a distribution of their own (``testing/`` in the repository,
``pip install -e ./testing``): the Kubernetes API double, run in-process by tests and as a
process (``python -m sandboxctl_testing.kubeapi``) by tests and by the local lane kit, and
the namespace test hosts of the network tests and benchmarks. The runtime package never
imports them (an import contract in pyproject.toml)."""
