"""The envd ASGI app, with routes under ``/v1/sandboxes/{sandbox_id}/envd``.

Auth is the agent's: ``authorize(request, sandbox_id)`` decides (root token or that
sandbox's token); a refusal answers 401 JSON. An unknown or released sandbox answers
``502 {"code": 502, "message": "The sandbox <id> was not found"}``, which the e2b SDK reports
as "sandbox not running".
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Send

from sandboxctl.envd import files
from sandboxctl.envd.connect import (
    END_STREAM,
    MAX_MESSAGE_BYTES,
    STREAM_CONTENT_TYPE,
    ConnectError,
    deadline_of,
    end_of_stream,
    envelope,
    error_response,
    is_stream_request,
    parse_envelope,
    parse_json,
    read_envelopes,
    stream_error_response,
)
from sandboxctl.envd.filesystem import FilesystemService
from sandboxctl.envd.host import SANDBOX_USER, BadCommand, Sandboxes, SandboxUnavailable
from sandboxctl.envd.process import ProcessService
from sandboxctl.envd.target import Target
from sandboxctl.envd.watch import WatchService

log = logging.getLogger("sandboxctl.envd")

PREFIX = "/v1/sandboxes/{sandbox_id}/envd"
PATH_PATTERN = r"^/v1/sandboxes/[^/]+/envd(/|$)"
Authorize = Callable[[Request, str], bool]


def create_envd_app(sandboxes: Sandboxes, authorize: Authorize) -> Starlette:
    processes = ProcessService()
    rpcs = ConnectRpc(processes, FilesystemService(), WatchService())

    def target_of(request: Request) -> Target:
        return Target(sandboxes.running(request.path_params["sandbox_id"]))

    Handler = Callable[[Request, Target], Awaitable[Response]]

    def guarded(handler: Handler, rpc: bool) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            streaming = rpc and is_stream_request(request.headers.get("content-type", ""))

            def failed(error: ConnectError) -> Response:
                return stream_error_response(error) if streaming else error_response(error)

            def refuse(status: int, code: str, message: str) -> Response:
                if rpc:
                    return failed(ConnectError(code, message))
                return files.http_error(status, message)

            if not authorize(request, request.path_params["sandbox_id"]):
                return refuse(
                    401, "unauthenticated", "the root or this sandbox's token is required"
                )
            user = requested_user(request)
            if user is not None and user != SANDBOX_USER:
                return refuse(
                    400,
                    "invalid_argument",
                    f"user {user!r} is not available: every command and file operation "
                    f"runs as the sandbox's user {SANDBOX_USER!r}",
                )
            try:
                return await handler(request, target_of(request))
            except SandboxUnavailable as error:
                return JSONResponse({"code": 502, "message": error.message}, status_code=502)
            except (ConnectError, BadCommand) as caught:
                refusal = (
                    caught
                    if isinstance(caught, ConnectError)
                    else ConnectError("invalid_argument", str(caught))
                )
                return failed(refusal) if rpc else files.error_reply(refusal)
            except Exception:
                log.exception("envd %s %s", request.method, request.url.path)
                return refuse(500, "internal", "internal error")

        return endpoint

    async def health(request: Request, target: Target) -> Response:
        return Response(status_code=204)

    async def get_files(request: Request, target: Target) -> Response:
        return await files.read_file(target, request)

    async def post_files(request: Request, target: Target) -> Response:
        return await files.write_files(target, request)

    routes = [
        Route(f"{PREFIX}/health", guarded(health, rpc=False), methods=["GET"]),
        Route(f"{PREFIX}/files", guarded(get_files, rpc=False), methods=["GET"]),
        Route(f"{PREFIX}/files", guarded(post_files, rpc=False), methods=["POST"]),
        Route(f"{PREFIX}/{{service}}/{{method}}", guarded(rpcs, rpc=True), methods=["POST"]),
    ]
    app = Starlette(routes=routes)
    app.state.processes = processes
    return app


@dataclass(frozen=True, slots=True)
class ConnectRpc:
    """The Connect RPCs (``/{service}/{method}``): which service answers each, in which
    form (a client stream, a server stream, or unary JSON)."""

    processes: ProcessService
    filesystem: FilesystemService
    watchers: WatchService

    async def __call__(self, request: Request, target: Target) -> Response:
        service = request.path_params["service"]
        method = request.path_params["method"]
        content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        deadline = deadline_of(request.headers)
        if (service, method) == ("process.Process", "StreamInput"):  # client streaming
            _require_stream(content_type)
            # The whole input is read (and written to the process) before the one answer.
            taken = await self.processes.stream_input(target, read_envelopes(request.stream()))
            return ConnectStream(_only(taken))
        body = await _read_body(request)
        if (service, method) in SERVER_STREAMS:
            _require_stream(content_type)
            message = parse_envelope(body)
            return ConnectStream(_safe(await self._stream(method, target, message, deadline)))
        if content_type != "application/json":
            return JSONResponse(
                ConnectError("unimplemented", f"unsupported content type {content_type!r}").json(),
                status_code=415,
            )
        return JSONResponse(await self._unary(service, method, target, parse_json(body)))

    async def _stream(
        self, method: str, target: Target, message: dict[str, Any], deadline: float | None
    ) -> AsyncIterator[bytes]:
        if method == "Start":
            return await self.processes.start(target, message, deadline)
        if method == "Connect":
            return await self.processes.connect(target, message, deadline)
        return await self.watchers.watch_dir(target, message, deadline)

    async def _unary(
        self, service: str, method: str, target: Target, message: dict[str, Any]
    ) -> dict[str, Any]:
        if service == "process.Process":
            return await self._process(method, target, message)
        if service != "filesystem.Filesystem":
            raise ConnectError("unimplemented", f"{service}/{method} is not implemented")
        if method == "CreateWatcher":
            return await self.watchers.create(target, message)
        if method == "GetWatcherEvents":
            return self.watchers.events(target, message)
        if method == "RemoveWatcher":
            return await self.watchers.remove(target, message)
        return await self.filesystem.call(target, method, message)

    async def _process(
        self, method: str, target: Target, message: dict[str, Any]
    ) -> dict[str, Any]:
        if method == "List":
            return await self.processes.list(target)
        if method == "SendSignal":
            return await self.processes.send_signal(target, message)
        if method == "SendInput":
            return await self.processes.send_input(target, message)
        if method == "CloseStdin":
            return await self.processes.close_stdin(target, message)
        if method == "Update":
            return await self.processes.update(target, message)
        raise ConnectError("unimplemented", f"process.Process/{method} is not implemented")


# The server-streaming RPCs: their one request comes as an envelope.
SERVER_STREAMS = frozenset(
    {
        ("process.Process", "Start"),
        ("process.Process", "Connect"),
        ("filesystem.Filesystem", "WatchDir"),
    }
)


def _require_stream(content_type: str) -> None:
    if content_type != STREAM_CONTENT_TYPE:
        raise ConnectError("unimplemented", f"unsupported content type {content_type!r}")


def requested_user(request: Request) -> str | None:
    """The user the SDK asked for, if any: its ``user=`` is ``username`` on ``/files`` and
    an ``Authorization: Basic`` header on RPCs, which the proxy passes on as
    ``X-Forwarded-Authorization`` (the agent's own Authorization is the claim token)."""
    if username := request.query_params.get("username"):
        return username
    scheme, _, credentials = request.headers.get("x-forwarded-authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(credentials, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[0] or None


async def _read_body(request: Request) -> bytes:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_MESSAGE_BYTES:
            raise ConnectError("resource_exhausted", "request message too large")
    return bytes(body)


class ConnectStream(StreamingResponse):
    """A Connect server stream whose end-of-stream envelope also ends the body, so the
    end goes out in one write rather than two (and costs the proxy one relay less)."""

    def __init__(self, envelopes: AsyncIterator[bytes]) -> None:
        super().__init__(envelopes, media_type=STREAM_CONTENT_TYPE)
        self.envelopes = envelopes

    async def stream_response(self, send: Send) -> None:
        start = {"type": "http.response.start", "status": self.status_code}
        await send({**start, "headers": self.raw_headers})
        ended = False
        async for chunk in self.envelopes:  # _safe: exactly one end-of-stream, the last
            ended = bool(chunk[0] & END_STREAM)
            await send({"type": "http.response.body", "body": chunk, "more_body": not ended})
        if not ended:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _only(message: dict[str, Any]) -> AsyncIterator[bytes]:
    """A client-streaming call's one answer, as the stream it is sent on."""
    yield envelope(message)
    yield end_of_stream()


async def _safe(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Every stream ends with an end-of-stream envelope, even after a failure."""
    try:
        async for chunk in events:
            yield chunk
    except Exception:
        log.exception("envd stream failed")
        yield end_of_stream(ConnectError("internal", "internal error"))
