"""What the three JSON apps share: the host agent's API, the e2b API and the Sandbox API.

Each app is a FastAPI app of plain functions over its own service; what they do alike is
written here once:

* :class:`HttpError`: an error an app answers, with its status and headers; each app's
  own subclass says what its error bodies look like (``{"error"}``, ``{"code",
  "message"}``, a Kubernetes ``Status``);
* :func:`install_error_handlers`: every error becomes one of those answers, the routing
  framework's (404, 405) and bugs (500) included;
* :func:`blocking`: a blocking call on the thread pool, its errors turned into the app's;
* :func:`read_body`: a request body, read into its typed shape (``core.wire``), within
  the bounds :class:`BodyCap` sets (size) and :func:`read_body` checks (depth, media type);
* :func:`answer`: a JSON answer, with the bytes ``core.wire`` writes.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sandboxctl.core import wire
from sandboxctl.core.errors import InvalidValueError, SandboxctlError

log = logging.getLogger("sandboxctl")

T = TypeVar("T")
JSON: Final = "application/json"


class HttpError(Exception):
    """An error an app answers with ``status``; :meth:`body` is its JSON, which each
    app's subclass shapes."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})

    def body(self) -> object:
        return {"message": self.message}


class BodyRefused(InvalidValueError):
    """A request body that cannot be read at all: missing, not JSON, nested too deeply
    (each app answers it 400)."""


NO_BODY: Final = "a JSON object body is required"
NOT_JSON: Final = "request body is not valid JSON"


def json_app(title: str) -> FastAPI:
    """A FastAPI app with no documentation routes: every route is the API's."""
    return FastAPI(title=title, docs_url=None, redoc_url=None, openapi_url=None)


def answer(body: object, status: int = 200, headers: Mapping[str, str] | None = None) -> Response:
    """``body`` (shapes, dicts, lists) as a JSON answer."""
    return Response(wire.encode(body), status_code=status, headers=headers, media_type=JSON)


def no_content() -> Response:
    return Response(status_code=204)


async def blocking(
    fn: Callable[..., T], /, *args: Any, translate: Callable[[Exception], HttpError], **kwargs: Any
) -> T:
    """``fn(*args, **kwargs)`` on the thread pool (it may wait on a node); what it raises
    becomes the app's answer, by ``translate`` (an HttpError passes as it is)."""
    try:
        return await run_in_threadpool(fn, *args, **kwargs)
    except HttpError:
        raise
    except Exception as error:
        raise translate(error) from error


async def read_body(
    request: Request,
    shape: type[T],
    *,
    required: bool = True,
    media_type: Callable[[str], None] | None = None,
    max_depth: int | None = None,
) -> T | None:
    """The request's body read as ``shape``; None when there is none and it is not
    ``required``. :class:`BodyRefused` when it cannot be read at all, or arrays and
    objects nest deeper than ``max_depth``; ``media_type`` raises the app's refusal of
    the Content-Type it is given (lowercased, without parameters); ``core.wire.WireError``
    names the field that does not fit."""
    raw = await request.body()
    if not raw.strip():
        if required:
            raise BodyRefused(NO_BODY)
        return None
    if media_type is not None:
        media_type(request.headers.get("content-type", "").partition(";")[0].strip().lower())
    try:
        data: object = raw
        if max_depth is not None:
            data = wire.json_value(raw)
            if _deeper_than(data, max_depth):  # what is built from it would recurse as far
                raise BodyRefused(f"the request body nests deeper than {max_depth} levels")
        return wire.decode(shape, data)
    except wire.NotJson as error:
        nested = error.problem == wire.TOO_DEEP
        raise BodyRefused(f"{NOT_JSON}: {wire.TOO_DEEP}" if nested else NOT_JSON) from None


def body(
    shape: type[T],
    *,
    required: bool = True,
    media_type: Callable[[str], None] | None = None,
    max_depth: int | None = None,
) -> Callable[[Request], Awaitable[T]]:
    """A route dependency that reads the request body into ``shape`` (:func:`read_body`);
    a body that is not required and not sent is the shape's defaults."""

    async def read(request: Request) -> T:
        found = await read_body(
            request, shape, required=required, media_type=media_type, max_depth=max_depth
        )
        return shape() if found is None else found

    return read


def refusal(error: InvalidValueError) -> str:
    """The words of a body's refusal, the same in every app: the body as a whole (not
    an object) as one sentence, a field as ``field: problem``."""
    if isinstance(error, wire.WireError) and not error.field:
        return NO_BODY if error.problem.startswith("expected an object") else error.problem
    return str(error)


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest deeper than ``limit`` in ``value`` (no recursion)."""
    if not isinstance(value, dict | list):
        return False
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                pending.append((child, depth + 1))
    return False


# --- errors -----------------------------------------------------------------------------


def install_error_handlers(
    app: FastAPI,
    *,
    translate: Callable[[Request, Exception], HttpError],
    unmatched: Callable[[int, str], HttpError],
    expected: tuple[type[Exception], ...] = (),
) -> None:
    """Answer every error as the app's JSON. ``translate`` makes the app's answer of any
    exception a route raised (a bug is a 500, which it logs); ``unmatched`` that of the
    framework's own refusals (404 no route, 405 no method). Every error sandboxctl raises
    on purpose, and ``expected``, is answered without a traceback."""

    async def answered(request: Request, error: Exception) -> Response:
        return respond(error if isinstance(error, HttpError) else translate(request, error))

    async def framework(_: Request, error: Exception) -> Response:
        assert isinstance(error, StarletteHTTPException)
        return respond(unmatched(error.status_code, str(error.detail)))

    # Per class: Starlette hands an Exception handler's errors on to the server, which
    # logs a traceback; these are answers, not crashes.
    for kind in (HttpError, RequestValidationError, SandboxctlError, *expected):
        app.add_exception_handler(kind, answered)
    app.add_exception_handler(StarletteHTTPException, framework)
    app.add_exception_handler(Exception, answered)


def respond(error: HttpError) -> Response:
    return answer(error.body(), status=error.status, headers=error.headers or None)


class BodyCap:
    """ASGI middleware: read a request's body up to ``limit`` bytes before the app runs,
    and answer ``refuse(limit)`` (a JSON body) with 413 past it, announced or streamed.

    The app then gets the whole body at once, so a client that hangs up while sending
    it costs one log line here instead of a traceback in a route. Only for apps whose
    bodies are small JSON documents: it buffers what it lets through.
    """

    def __init__(self, app: ASGIApp, limit: int, refuse: Callable[[int], HttpError]) -> None:
        self.app = app
        self.limit = limit
        self.refuse = refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            await self._too_large(send)
            return
        body = await self._whole_body(scope, receive, send)
        if body is None:
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _whole_body(self, scope: Scope, receive: Receive, send: Send) -> bytes | None:
        """The body, or None when it was answered here (too large, or the client left)."""
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                log.info(
                    "%s %s: the client hung up while sending its body",
                    scope["method"],
                    scope["path"],
                )
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                await self._too_large(send)
                return None
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _too_large(self, send: Send) -> None:
        payload = wire.encode(self.refuse(self.limit).body())
        headers = [
            (b"content-type", JSON.encode()),
            (b"content-length", b"%d" % len(payload)),
            (b"connection", b"close"),  # the rest of the body is not read
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
