"""``GET /files`` and ``POST /files``: file bytes streamed through ``cat`` inside the
sandbox, never held whole in memory. Errors are ``{"code": <http status>, "message"}``.
"""

from __future__ import annotations

import contextlib
import posixpath
import zlib
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from sandboxctl.envd.connect import STATUS, ConnectError
from sandboxctl.envd.host import Command
from sandboxctl.envd.hostprocess import HostProcess
from sandboxctl.envd.multipart import Begin, Data, End, MultipartError, MultipartParser, boundary_of
from sandboxctl.envd.target import Target, sandbox_path

READ_BYTES = 256 << 10
WRITE_SCRIPT = 'mkdir -p -- "$(dirname -- "$1")" && exec cat > "$1"'


def http_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def _failure(status: int, stderr: bytes, path: str) -> ConnectError:
    text = stderr.decode(errors="replace").strip()
    lowered = text.lower()
    if "no such file" in lowered:
        return ConnectError("not_found", f"path not found: {path}")
    if "is a directory" in lowered or "not a directory" in lowered:
        return ConnectError("invalid_argument", f"{path}: {text}")
    if "permission denied" in lowered or "read-only file system" in lowered:
        return ConnectError("permission_denied", f"{path}: {text}")
    if "no space left" in lowered or "quota" in lowered:
        return ConnectError("resource_exhausted", f"{path}: not enough space")
    return ConnectError("internal", f"{path}: {text or f'exit status {status}'}")


def error_reply(error: ConnectError) -> JSONResponse:
    status = 507 if error.code == "resource_exhausted" else STATUS[error.code]
    return http_error(status, error.message)


async def read_file(target: Target, request: Request) -> Response:
    path = sandbox_path(request.query_params.get("path"))
    process = await target.spawn(Command(["cat", "--", path]))
    assert process.stdout is not None
    assert process.stderr is not None
    first = await process.stdout.read(READ_BYTES)
    if not first:
        stderr = await process.stderr.read()
        status = await process.wait()
        if status != 0:
            return error_reply(_failure(status, stderr, path))

    async def body() -> AsyncIterator[bytes]:
        assert process.stdout is not None
        try:
            if first:
                yield first
            while chunk := await process.stdout.read(READ_BYTES):
                yield chunk
            await process.wait()
        finally:
            target.kill_soon(process)

    return StreamingResponse(body(), media_type="application/octet-stream")


async def write_files(target: Target, request: Request) -> Response:
    query_path = request.query_params.get("path")
    content_type = request.headers.get("content-type", "")
    if content_type.startswith("multipart/form-data"):
        written = await _write_parts(target, request, boundary_of(content_type), query_path)
    else:
        if not query_path:
            raise ConnectError("invalid_argument", "the path query parameter is required")
        encoding = request.headers.get("content-encoding", "identity").lower()
        if encoding not in ("identity", "gzip"):
            return http_error(415, f"unsupported content encoding {encoding}")
        written = [await _write_body(target, request, query_path, encoding == "gzip")]
    if not written:
        raise ConnectError("invalid_argument", "no file in the request")
    return JSONResponse(written)


async def _write_parts(
    target: Target, request: Request, boundary: bytes, query_path: str | None
) -> list[dict[str, Any]]:
    """Each file part of a multipart body to its own file, as it arrives: its filename,
    or the path query parameter (a signed URL's), which names one file."""
    parser = MultipartParser(boundary)
    written: list[dict[str, Any]] = []
    writer: _Writer | None = None
    try:
        async for chunk in request.stream():
            for event in parser.feed(chunk):
                if isinstance(event, Begin):
                    writer = await _Writer.open(target, _part_path(event, query_path, written))
                elif isinstance(event, Data) and writer is not None:
                    await writer.write(event.data)
                elif isinstance(event, End) and writer is not None:
                    written.append(await writer.close())
                    writer = None
        parser.close()
    except MultipartError as error:
        raise ConnectError("invalid_argument", str(error)) from None
    finally:
        if writer is not None:
            await writer.abort()
    return written


def _part_path(part: Begin, query_path: str | None, written: list[dict[str, Any]]) -> str:
    if query_path and written:  # a signed URL's path, and one more file
        raise ConnectError(
            "invalid_argument", "the path query parameter names one file: send one part"
        )
    name = query_path or part.filename
    if not name:
        raise ConnectError("invalid_argument", "a file part has no filename")
    return sandbox_path(name)


async def _write_body(target: Target, request: Request, path: str, gzipped: bool) -> dict[str, Any]:
    """The whole body (inflated when gzipped) to ``path``."""
    inflate = zlib.decompressobj(16 + zlib.MAX_WBITS) if gzipped else None
    writer = await _Writer.open(target, sandbox_path(path))
    try:
        async for chunk in request.stream():
            await writer.write(inflate.decompress(chunk) if inflate else chunk)
        if inflate is not None:
            await writer.write(inflate.flush())
        return await writer.close()
    except zlib.error:
        raise ConnectError("invalid_argument", "the body is not valid gzip") from None
    finally:
        await writer.abort()


class _Writer:
    """``cat > path`` inside the sandbox, fed as the body arrives."""

    def __init__(self, target: Target, path: str, process: HostProcess) -> None:
        self.target = target
        self.path = path
        self.process = process
        self.done = False

    @classmethod
    async def open(cls, target: Target, path: str) -> _Writer:
        argv = ["/bin/sh", "-c", WRITE_SCRIPT, "sh", path]
        command = Command(argv, stdin="pipe", inline_shell=True)
        return cls(target, path, await target.spawn(command))

    async def write(self, data: bytes) -> None:
        if not data:
            return
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(data)
            await self.process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            await self._fail()

    async def close(self) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.close()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await self.process.stdin.wait_closed()
        status = await self.process.wait()
        if status != 0:
            await self._fail()
        self.done = True
        return {"name": posixpath.basename(self.path), "type": "file", "path": self.path}

    async def _fail(self) -> None:
        assert self.process.stderr is not None
        stderr = await self.process.stderr.read()
        status = await self.process.wait()
        self.done = True
        raise _failure(status, stderr, self.path)

    async def abort(self) -> None:
        if not self.done:
            self.done = True
            await self.target.kill(self.process)
