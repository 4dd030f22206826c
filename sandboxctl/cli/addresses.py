"""Listen and advertise addresses as flags give them."""

from __future__ import annotations

from sandboxctl.core.errors import InvalidValueError


def parse_listen(flag: str, text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` -> (host, port); port 0 asks the kernel for one."""
    host, colon, port = text.rpartition(":")
    host = host.strip("[]")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidValueError(f"{flag} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7777")
    return host, int(port)


def join_host_port(host: str, port: int) -> str:
    """The inverse of parse_listen: IPv6 hosts get their brackets back."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
