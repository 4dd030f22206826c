"""The groups serve-apiserver reviews a front-proxied user in: Kubernetes puts every
authenticated user in ``system:authenticated``, and kube-apiserver's own discovery and
OpenAPI fetches name a user without groups (found through the real aggregator: without
the group, system:discovery did not apply and the Sandbox resources never reached
kube-apiserver's discovery)."""

from __future__ import annotations

import pytest

from sandboxctl.apiserver.delegated import authenticated_groups


@pytest.mark.parametrize(
    ("name", "groups", "expected"),
    [
        ("system:kube-aggregator", [], ("system:authenticated",)),
        ("alice", ["team"], ("team", "system:authenticated")),
        ("alice", ["system:authenticated", "team"], ("system:authenticated", "team")),
        ("system:anonymous", ["system:unauthenticated"], ("system:unauthenticated",)),
        ("system:anonymous", [], ()),
    ],
)
def test_an_authenticated_user_is_in_system_authenticated(
    name: str, groups: list[str], expected: tuple[str, ...]
) -> None:
    assert authenticated_groups(name, groups) == expected
