"""What the three JSON apps share (serving/apps.py), on a small app of its own: body reading
and its refusals, every error answered in the app's own body, the body cap."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

import httpx
import pytest
from fastapi import Depends
from starlette.responses import Response

from sandboxctl.core.errors import InvalidValueError
from sandboxctl.core.wire import Count, Model
from sandboxctl.serving.apps import (
    BodyCap,
    HttpError,
    answer,
    body,
    install_error_handlers,
    json_app,
    refusal,
)
from tests.apiserver.helpers import serving


class Refused(HttpError):
    def body(self) -> object:
        return {"why": self.message}


class Order(Model, frozen=True, forbid_unknown_fields=True):
    count: Count
    note: str = ""


class Options(Model, frozen=True):
    verbose: bool = False


def _no_yaml(media_type: str) -> None:
    if media_type == "application/yaml":
        raise Refused(415, "send JSON")


OrderBody = Annotated[Order, Depends(body(Order, media_type=_no_yaml, max_depth=4))]
OptionsBody = Annotated[Options, Depends(body(Options, required=False))]


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    app = json_app("test")

    @app.post("/orders")
    def order(
        made: Annotated[Order, Depends(body(Order, media_type=_no_yaml, max_depth=4))],
    ) -> Response:
        return answer(made, status=201)

    @app.post("/optional")
    def optional(given: OptionsBody) -> Response:
        return answer(given)

    @app.get("/refuse")
    def refuse() -> Response:
        raise InvalidValueError("a value that does not parse")

    @app.get("/bug")
    def bug() -> Response:
        raise KeyError("oops")

    def translate(_: object, error: Exception) -> HttpError:
        if isinstance(error, InvalidValueError):
            return Refused(400, refusal(error))
        return Refused(500, f"internal error: {type(error).__name__}")

    install_error_handlers(
        app, translate=translate, unmatched=lambda status, _: Refused(status, "no route")
    )
    app.add_middleware(BodyCap, limit=64, refuse=lambda limit: Refused(413, f"over {limit}"))
    with serving(app) as url, httpx.Client(base_url=url) as client:
        yield client


@pytest.mark.parametrize(
    ("content", "headers", "status", "why"),
    [
        (b'{"count": 2}', {}, 201, None),
        (b"", {}, 400, "a JSON object body is required"),
        (b"{not json", {}, 400, "request body is not valid JSON"),
        (b"[1]", {}, 400, "a JSON object body is required"),
        (b'{"count": -1}', {}, 400, "count: must not be negative, got -1"),
        (b'{"count": 1, "x": 1}', {}, 400, "x: unknown field"),
        (b'{"count": 1, "note": [[[[[1]]]]]}', {}, 400,
         "the request body nests deeper than 4 levels"),
        (b'{"count": 1}', {"Content-Type": "application/yaml"}, 415, "send JSON"),
        (b'{"count": 1, "note": "' + b"x" * 100 + b'"}', {}, 413, "over 64"),
    ],
)  # fmt: skip
def test_a_body_is_read_into_its_shape_or_refused_in_the_apps_words(
    client: httpx.Client, content: bytes, headers: dict[str, str], status: int, why: str | None
) -> None:
    reply = client.post("/orders", content=content, headers=headers)
    assert reply.status_code == status, reply.text
    if why is not None:
        assert reply.json() == {"why": why}


def test_a_body_that_is_not_required_may_be_left_out(client: httpx.Client) -> None:
    assert client.post("/optional", content=b"").json() == {"verbose": False}
    assert client.post("/optional", content=b'{"verbose": true}').json() == {"verbose": True}


def test_every_error_is_an_answer_of_the_app(client: httpx.Client) -> None:
    assert client.get("/refuse").json() == {"why": "a value that does not parse"}
    assert client.get("/nowhere").json() == {"why": "no route"}
    assert client.put("/orders").status_code == 405
    bug = client.get("/bug")
    assert (bug.status_code, bug.json()) == (500, {"why": "internal error: KeyError"})
