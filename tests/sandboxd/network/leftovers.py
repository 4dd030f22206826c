"""What of one agent's sandboxes the host still holds, counted from the kernel's side."""

from __future__ import annotations

import json
import os
import subprocess

from sandboxctl.sandboxd.network.firewall import table_name

UID_SPAN = 20


def count_leftovers(key: str, subnet: str, uid_base: int) -> dict[str, int]:
    """Veths with the agent's alias, routes into its subnet, ``sb_`` chains and set or map
    elements of its table, and network namespaces of processes of its uids."""
    listed = subprocess.run(
        ["nft", "-j", "list", "table", "inet", table_name(key)], capture_output=True, text=True
    )
    objects = json.loads(listed.stdout)["nftables"] if listed.returncode == 0 else []
    links = json.loads(_out(["ip", "-j", "-d", "link", "show", "type", "veth"]) or "[]")
    routes = _out(["ip", "-4", "route", "show", subnet]).splitlines()
    return {
        "veths": sum(1 for link in links if link.get("ifalias") == f"sandboxctl:{key}"),
        "routes": len(routes),
        "chains": sum(1 for o in objects if o.get("chain", {}).get("name", "").startswith("sb_")),
        "elements": sum(len(o[kind].get("elem", [])) for o in objects for kind in ("set", "map")
                        if kind in o and o[kind]["name"] != "subnet"),
        "namespaces": len(_namespaces_of_uids(uid_base)),
    }  # fmt: skip


def _namespaces_of_uids(uid_base: int) -> set[str]:
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if uid_base <= os.stat(f"/proc/{entry}").st_uid < uid_base + UID_SPAN:
                found.add(os.readlink(f"/proc/{entry}/ns/net"))
        except OSError:  # it ended meanwhile
            continue
    return found


def _out(command: list[str]) -> str:
    return subprocess.run(command, capture_output=True, text=True, check=True).stdout
