"""Hardening, with the unmodified e2b SDK on real bubblewrap sandboxes (agent, mesh
inventory, store, e2b API and envd proxy on loopback):
every place a sandbox can write is bounded (ENOSPC, nothing on the host's disk), a signed
upload URL writes exactly its path, and a sandbox whose init died is gone at once."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.proxy.sdk_stack import DOMAIN, create_sandbox
from tests.sandboxd.servers import wait_until

MiB = 1 << 20


@pytest.fixture
def sandbox(sdk: dict[str, Any]) -> Iterator[Any]:
    box = create_sandbox(sdk)
    yield box
    box.kill()


# --- bounded homes and tmpfs ---------------------------------------------------------------


def test_a_full_home_is_enospc_inside_and_nothing_on_the_host(sandbox: Any) -> None:
    from e2b import CommandExitException

    from sandboxctl.sandboxd.runtime import SIZE_LIMITS, Size

    limit = SIZE_LIMITS[Size.SMALL].home_bytes
    free_before = shutil.disk_usage("/").free
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run(f"head -c {limit + 16 * MiB} /dev/zero > ~/big")
    assert "No space left on device" in failed.value.stderr
    size = int(sandbox.commands.run("stat -c %s ~/big").stdout)
    assert limit - 16 * MiB <= size <= limit
    # The bytes are the sandbox's (in its memory), not the host disk's.
    assert shutil.disk_usage("/").free > free_before - 64 * MiB
    # The sandbox goes on working: freeing space lets it write again.
    sandbox.commands.run("rm ~/big && echo ok > ~/small")
    assert sandbox.files.read("/home/user/small") == "ok\n"


@pytest.mark.parametrize("place", ["/dev/shm", "/tmp", "/run"])
def test_every_other_writable_tmpfs_is_bounded(sandbox: Any, place: str) -> None:
    from e2b import CommandExitException

    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run(f"head -c {1 << 30} /dev/zero > {place}/big")
    assert "No space left on device" in failed.value.stderr
    sandbox.commands.run(f"rm -f {place}/big")


@pytest.mark.parametrize("place", ["/home", "/dev", "/"])
def test_the_rest_is_read_only(sandbox: Any, place: str) -> None:
    from e2b import CommandExitException

    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run(f"echo x > {place.rstrip('/')}/written")
    assert "Read-only file system" in failed.value.stderr


# --- a signed upload URL writes exactly its path -----------------------------------------


def test_a_signed_upload_url_writes_only_the_signed_path(sdk: dict[str, Any]) -> None:
    sandbox = create_sandbox(sdk)
    # What a wildcard DNS name would carry: the sandbox is in the host.
    host = {"Host": f"49983-{sandbox.sandbox_id}.{DOMAIN}"}
    try:
        url = sandbox.upload_url("/home/user/up.txt")
        files = [
            ("file", ("up.txt", b"the signed one")),
            ("file", ("other.txt", b"smuggled")),
        ]
        reply = httpx.post(url, headers=host, files=files, timeout=30)
        assert reply.status_code == 400, reply.text
        assert sandbox.files.read("/home/user/up.txt") == "the signed one"
        assert not sandbox.files.exists("/home/user/other.txt")
        # One part, as the URL is meant to be used, is written as before.
        again = httpx.post(url, headers=host, files=[("file", ("x", b"again"))], timeout=30)
        assert again.status_code == 200, again.text
        assert sandbox.files.read("/home/user/up.txt") == "again"
        # A URL signed without a path would let the parts name any path: refused.
        unsigned = url.replace("path=%2Fhome%2Fuser%2Fup.txt&", "")
        assert unsigned != url
        form = [("file", ("/home/user/any.txt", b"x"))]
        reply = httpx.post(unsigned, headers=host, files=form, timeout=30)
        assert reply.status_code in (400, 401), reply.text
        assert not sandbox.files.exists("/home/user/any.txt")
    finally:
        sandbox.kill()


# --- a sandbox whose init died ---------------------------------------------------------


def test_a_sandbox_killed_from_inside_is_gone_at_once(sdk: dict[str, Any]) -> None:
    from e2b import Sandbox
    from e2b.exceptions import NotFoundException, SandboxNotRunningException

    sandbox = create_sandbox(sdk)
    inits = sandbox.commands.run("ps -o pid=,comm= -p 1,2").stdout.split()
    assert inits == ["1", "bwrap", "2", "sleep"]
    api = {k: v for k, v in sdk.items() if k != "sandbox_url"}
    # The sandbox's own sleep is what keeps its init (bwrap, pid 1) alive.
    sandbox.commands.run("kill -KILL 2", background=True)

    def gone() -> bool:
        try:
            Sandbox.get_info(sandbox.sandbox_id, **api)
        except NotFoundException:
            return True
        return False

    wait_until(gone, timeout=10, what="get_info to say the sandbox is gone")
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("echo still there?")

    def unlisted() -> bool:  # lists follow the inventory: at its next poll
        listed = Sandbox.list(**api).next_items()
        return sandbox.sandbox_id not in {info.sandbox_id for info in listed}

    wait_until(unlisted, timeout=10, what="the list to drop it")
