"""Operations this fleet does not serve answer 501 saying what and why, never a 404 the
SDK would take for a missing sandbox; every operation the pinned Python SDK's client
calls, and every one of e2b's OpenAPI document, is routed (served or 501); a connect of
an unknown id says that sandbox was not found."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import e2b
import httpx
import pytest
from e2b import Sandbox, SandboxException
from e2b.exceptions import NotFoundException

from sandboxctl.apiserver.e2b import E2bConfig, create_e2b_app
from sandboxctl.apiserver.e2b.routes import ROUTES
from sandboxctl.apiserver.e2b.routes.unserved import UNSERVED
from sandboxctl.clock import ManualClock
from sandboxctl.core.freshness import FreshnessRule
from sandboxctl.inventory.memory import MemoryInventorySource
from sandboxctl.store import SandboxStore
from tests.apiserver.e2b.test_fuzz import SPEC
from tests.apiserver.e2b.test_http import KEY, T0, entry, node
from tests.apiserver.helpers import serving

SDK_CLIENT = Path(e2b.__file__).parent / "api" / "client" / "api"
PARAMETER = re.compile(r"\{[^}]*\}")
# a generated client module's request: "method": "post", then "url": f"/sandboxes/{...}"
SDK_CALL = re.compile(r'"method": "(\w+)",\s*"url": f?"([^"]+)"')


def _shape(method: str, path: str) -> tuple[str, str]:
    return method.upper(), PARAMETER.sub("{}", path)


ROUTED = {_shape(method, path) for method, path, _ in ROUTES}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    source = MemoryInventorySource((node("n1", entry(1)),), clock=ManualClock(T0))
    store = SandboxStore(source, FreshnessRule(), clock=ManualClock(T0))
    config = E2bConfig(domain="example.test", envd_secret=b"s", api_keys={KEY: "default"})
    with serving(create_e2b_app(store, config)) as served:
        yield served


def test_every_call_of_the_pinned_sdk_client_is_routed() -> None:
    calls = {
        _shape(method, path)
        for module in SDK_CLIENT.rglob("*.py")
        for method, path in SDK_CALL.findall(module.read_text())
    }
    assert len(calls) > 30, f"the SDK's client was not read from {SDK_CLIENT}"
    assert calls - ROUTED == set()


def test_every_operation_of_the_openapi_document_is_routed() -> None:
    if not SPEC.is_file():
        pytest.skip(f"e2b's OpenAPI document is not at {SPEC} (set SANDBOXCTL_E2B_OPENAPI)")
    operation = re.compile(r"^  (/\S*):$|^    (get|post|put|patch|delete):$", re.MULTILINE)
    path, operations = "", set()
    for found_path, method in operation.findall(SPEC.read_text()):
        path = found_path or path
        if method:
            operations.add(_shape(method, path))
    assert len(operations) > 50
    assert operations - ROUTED == set()


def test_a_parameter_is_spelled_alike_on_every_route() -> None:
    """The route template is the request histogram's ``route`` label: the sandbox of
    ``/sandboxes/{sandbox_id}/fork`` is spelled as that of the served routes."""
    spellings: dict[str, set[str]] = {}
    for _, path, _ in ROUTES:
        segments = path.split("/")
        for before, segment in itertools.pairwise(segments):
            if PARAMETER.fullmatch(segment):
                spellings.setdefault(before, set()).add(segment)
    assert {before: names for before, names in spellings.items() if len(names) > 1} == {}
    assert spellings["sandboxes"] == {"{sandbox_id}"}
    assert spellings["templates"] == {"{template_id}"}


def test_unserved_operations_are_not_served_twice() -> None:
    unserved = [_shape(op.method, op.path) for op in UNSERVED]
    served = [_shape(m, p) for m, p, _ in ROUTES[: len(ROUTES) - len(UNSERVED)]]
    assert len(set(unserved)) == len(unserved)
    assert set(unserved).isdisjoint(served)


@pytest.mark.parametrize(
    ("method", "path", "named"),
    [
        ("POST", "/sandboxes/sb-0001de/fork", "fork"),
        ("POST", "/sandboxes/sb-0001de/snapshots", "a snapshot"),
        ("GET", "/snapshots", "the snapshot list"),
        ("POST", "/v3/templates", "a template build"),
        ("DELETE", "/templates/base", "a template removal"),
        ("GET", "/templates/base/tags", "template tags"),
        ("DELETE", "/templates/tags", "template tags"),
        ("GET", "/secrets", "secrets"),
        ("PUT", "/volumecontent/v1/file", "a volume's content"),
        ("GET", "/teams", "teams"),
    ],
)
def test_an_unserved_operation_answers_501_saying_what_and_why(
    url: str, method: str, path: str, named: str
) -> None:
    answer = httpx.request(method, url + path, headers={"X-API-Key": KEY}, json={}, timeout=10)
    assert answer.status_code == 501, answer.text
    body = answer.json()
    assert body["code"] == 501
    assert body["message"].startswith(f"{named} ({method} ")
    assert "is not served by this fleet: " in body["message"]
    assert answer.headers["Should-Retry"] == "false"


def test_an_unserved_operation_checks_the_key_first(url: str) -> None:
    answer = httpx.post(url + "/sandboxes/sb-0001de/fork", headers={"X-API-Key": "nope"})
    assert answer.status_code == 401


def test_the_sdk_raises_a_clear_exception_for_fork_and_snapshot(url: str) -> None:
    options = {"api_key": KEY, "api_url": url}
    with pytest.raises(SandboxException) as forked:
        Sandbox.fork("sb-0001de", **options)  # type: ignore[call-overload]
    assert not isinstance(forked.value, NotFoundException)
    assert "501: fork (POST /sandboxes/{sandbox_id}/fork) is not served" in str(forked.value)
    with pytest.raises(SandboxException) as snapshot:
        Sandbox.create_snapshot("sb-0001de", **options)  # type: ignore[call-overload]
    assert "not found" not in str(snapshot.value)
    assert "501: a snapshot" in str(snapshot.value)


def test_a_connect_of_an_unknown_id_says_the_sandbox_was_not_found(url: str) -> None:
    answer = httpx.post(
        url + "/v2/sandboxes/sb-feedbeef/connect", headers={"X-API-Key": KEY}, json={}
    )
    assert answer.status_code == 404
    assert answer.json() == {"code": 404, "message": "sandbox 'sb-feedbeef' not found"}
