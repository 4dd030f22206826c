"""The ``filesystem.Filesystem`` service: each call runs a small python3 helper *inside*
the sandbox, as the sandbox's uid in its mount namespace, so neither ``..`` nor a symlink
can lead to a host file. The helper answers one JSON line: ``{"ok": ...}`` or
``{"error": [code, message]}``.
"""

from __future__ import annotations

import json
from typing import Any

from sandboxctl.envd.connect import ConnectError
from sandboxctl.envd.connect import field as get
from sandboxctl.envd.target import Target, sandbox_path

HELPER = r"""
import datetime, errno, grp, json, os, pwd, shutil, stat, sys

def name_of(table, key):
    try:
        return table(key)[0]
    except KeyError:
        return str(key)

def kind(mode):
    if stat.S_ISDIR(mode):
        return "FILE_TYPE_DIRECTORY"
    if stat.S_ISLNK(mode):
        return "FILE_TYPE_SYMLINK"
    return "FILE_TYPE_FILE"

def entry(path):
    st = os.lstat(path)
    info = {"name": os.path.basename(path) or "/", "path": path}
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        info["isSymlink"] = True
        info["symlinkTarget"] = os.path.realpath(path)
        try:
            mode = os.stat(path).st_mode
        except OSError:
            pass
    info["type"] = kind(mode)
    info["size"] = str(st.st_size)
    info["mode"] = stat.S_IMODE(st.st_mode)
    info["permissions"] = stat.filemode(st.st_mode)
    info["owner"] = name_of(pwd.getpwuid, st.st_uid)
    info["group"] = name_of(grp.getgrgid, st.st_gid)
    when = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc)
    info["modifiedTime"] = when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return info

def walk(path, depth, out):
    for name in sorted(os.listdir(path)):
        child = os.path.join(path, name)
        try:
            info = entry(child)
        except FileNotFoundError:
            continue
        out.append(info)
        if depth > 1 and info["type"] == "FILE_TYPE_DIRECTORY" and not info.get("isSymlink"):
            try:
                walk(child, depth - 1, out)
            except OSError:
                pass
    return out

def main(op, a):
    if op == "stat":
        return {"entry": entry(a["path"])}
    if op == "list":
        if not os.path.isdir(a["path"]):
            os.lstat(a["path"])
            raise NotADirectoryError(errno.ENOTDIR, "not a directory", a["path"])
        return {"entries": walk(a["path"], a["depth"], [])}
    if op == "mkdir":
        os.makedirs(a["path"])
        return {"entry": entry(a["path"])}
    if op == "move":
        os.lstat(a["source"])
        os.makedirs(os.path.dirname(a["destination"]) or "/", exist_ok=True)
        os.rename(a["source"], a["destination"])
        return {"entry": entry(a["destination"])}
    if op == "remove":
        st = os.lstat(a["path"])
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(a["path"])
        else:
            os.unlink(a["path"])
        return {}
    raise ValueError(op)

CODES = {
    errno.ENOENT: "not_found", errno.EEXIST: "already_exists", errno.ENOTEMPTY: "already_exists",
    errno.EACCES: "permission_denied", errno.EPERM: "permission_denied",
    errno.EROFS: "permission_denied", errno.ENOTDIR: "invalid_argument",
    errno.EISDIR: "invalid_argument", errno.EINVAL: "invalid_argument",
    errno.ENOSPC: "resource_exhausted", errno.EXDEV: "invalid_argument",
}
try:
    result = {"ok": main(sys.argv[1], json.loads(sys.argv[2]))}
except OSError as e:
    result = {"error": [CODES.get(e.errno, "internal"), f"{e.strerror}: {e.filename}"]}
print(json.dumps(result))
"""


class FilesystemService:
    async def call(self, target: Target, method: str, request: dict[str, Any]) -> dict[str, Any]:
        if method == "Stat":
            return await self._helper(target, "stat", {"path": _path(request)})
        if method == "ListDir":
            depth = int(get(request, "depth", 1) or 1)
            if depth < 1:
                raise ConnectError("invalid_argument", "depth must be at least 1")
            return await self._helper(target, "list", {"path": _path(request), "depth": depth})
        if method == "MakeDir":
            return await self._helper(target, "mkdir", {"path": _path(request)})
        if method == "Move":
            source = sandbox_path(get(request, "source"))
            destination = sandbox_path(get(request, "destination"))
            return await self._helper(
                target, "move", {"source": source, "destination": destination}
            )
        if method == "Remove":
            return await self._helper(target, "remove", {"path": _path(request)})
        raise ConnectError("unimplemented", f"filesystem.Filesystem/{method} is not implemented")

    async def _helper(self, target: Target, op: str, args: dict[str, Any]) -> dict[str, Any]:
        argv = ["python3", "-I", "-S", "-c", HELPER, op, json.dumps(args)]
        status, out, err = await target.run(argv)
        try:
            answer = json.loads(out)
        except ValueError:
            detail = err.decode(errors="replace").strip()[-500:]
            raise ConnectError(
                "internal", f"filesystem helper failed ({status}): {detail}"
            ) from None
        if "error" in answer:
            code, message = answer["error"]
            raise ConnectError(code, message)
        result: dict[str, Any] = answer["ok"]
        return result


def _path(request: dict[str, Any]) -> str:
    return sandbox_path(get(request, "path"))
