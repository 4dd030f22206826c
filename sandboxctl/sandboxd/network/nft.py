"""nftables through libnftables, in process, with its JSON API.

Why not the ``nft`` command: one ``nft -j -f -`` costs about 16 ms on the development
machine (a process and a full cache fetch per call), and a warm claim applies its policy
within a 5 ms budget; the same transaction through libnftables takes about 0.2 ms. The
project's own Python binding (``python3-nftables``) is packaged for Debian's system Python
only, and its PyPI copy (``pip-nftables``) installs a stray top-level ``__init__.py``, so
this module loads the library (Debian ``libnftables1``, pulled in by ``nftables``) with
ctypes: the four calls the binding itself makes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import threading
from typing import Any

from sandboxctl.sandboxd.runtime import RuntimeFailure

_OUTPUT_JSON = 1 << 4  # NFT_CTX_OUTPUT_JSON
_OUTPUT_HANDLE = 1 << 3  # NFT_CTX_OUTPUT_HANDLE
INSTALL_HINT = "install nftables: apt-get install nftables"


class NftError(RuntimeFailure):
    """libnftables refused a command; the message is nft's own."""


class Nft:
    """One libnftables context; thread-safe (calls are serialized: a context is not)."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("nftables") or "libnftables.so.1"
        try:
            lib = ctypes.CDLL(name)
        except OSError as error:
            raise RuntimeFailure(f"libnftables not found ({error}): {INSTALL_HINT}") from None
        lib.nft_ctx_new.restype = ctypes.c_void_p
        lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
        lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
        for buffer in ("nft_ctx_buffer_output", "nft_ctx_buffer_error"):
            getattr(lib, buffer).argtypes = [ctypes.c_void_p]
        for getter in ("nft_ctx_get_output_buffer", "nft_ctx_get_error_buffer"):
            getattr(lib, getter).restype = ctypes.c_char_p
            getattr(lib, getter).argtypes = [ctypes.c_void_p]
        lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
        self._lib = lib
        self._ctx = lib.nft_ctx_new(0)
        lib.nft_ctx_output_set_flags(self._ctx, _OUTPUT_JSON | _OUTPUT_HANDLE)
        lib.nft_ctx_buffer_output(self._ctx)
        lib.nft_ctx_buffer_error(self._ctx)
        self._lock = threading.Lock()

    def run(self, commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Run JSON commands as one transaction (all or nothing); the listed objects."""
        if not commands:
            return []
        payload = json.dumps({"nftables": commands}).encode()
        with self._lock:
            status = self._lib.nft_run_cmd_from_buffer(self._ctx, payload)
            output = self._lib.nft_ctx_get_output_buffer(self._ctx) or b""
            error = self._lib.nft_ctx_get_error_buffer(self._ctx) or b""
        if status != 0:
            raise NftError(f"nftables: {error.decode(errors='replace').strip() or 'failed'}")
        if not output.strip():
            return []
        listed: list[dict[str, Any]] = json.loads(output).get("nftables", [])
        return listed

    def list(self, what: dict[str, Any]) -> list[dict[str, Any]]:
        """``list`` one object (or every table); an absent object lists nothing."""
        try:
            return self.run([{"list": what}])
        except NftError as error:
            if "No such file or directory" in str(error):
                return []
            raise
