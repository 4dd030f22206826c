"""End to end with the unmodified e2b SDK: a real host agent (bubblewrap sandboxes, envd
served by the agent), the mesh inventory, the store, the e2b API and the envd proxy, all
on loopback. Skipped when sandboxes cannot run here."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.proxy.sdk_stack import DOMAIN, create_sandbox


def test_commands_and_files_through_the_proxy(sdk: dict[str, Any]) -> None:
    from e2b.exceptions import SandboxNotRunningException

    sandbox = create_sandbox(sdk)
    try:
        assert sandbox.commands.run("echo hi").stdout == "hi\n"
        sandbox.files.write("/tmp/proxy.txt", "through the proxy")
        assert sandbox.files.read("/tmp/proxy.txt") == "through the proxy"
    finally:
        sandbox.kill()
    # Released, though its owner is still cached: the proxy says not found.
    with pytest.raises(SandboxNotRunningException):
        sandbox.commands.run("echo again")


def test_a_wrong_access_token_is_refused(sdk: dict[str, Any]) -> None:
    sandbox = create_sandbox(sdk)
    try:
        response = httpx.post(
            f"{sdk['sandbox_url']}/process.Process/List",
            headers={
                "E2b-Sandbox-Id": sandbox.sandbox_id,
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": "0" * 64,
                "Content-Type": "application/json",
            },
            content=b"{}",
        )
        assert response.status_code == 401
    finally:
        sandbox.kill()


def test_signed_file_urls_from_the_sdk_work_host_routed(sdk: dict[str, Any]) -> None:
    sandbox = create_sandbox(sdk)
    # What a wildcard DNS name and a TLS edge would carry: the sandbox is in the host.
    host = {"Host": f"49983-{sandbox.sandbox_id}.{DOMAIN}"}
    try:
        sandbox.files.write("/home/user/signed.txt", "signed content")
        url = sandbox.download_url("/home/user/signed.txt", use_signature_expiration=60)
        assert "signature_expiration=" in url
        download = httpx.get(url, headers=host)
        assert download.status_code == 200, download.text
        assert download.content == b"signed content"

        upload_url = sandbox.upload_url("/home/user/uploaded.txt")
        form = {"file": ("/home/user/uploaded.txt", b"uploaded by URL")}
        upload = httpx.post(upload_url, headers=host, files=form)
        assert upload.status_code == 200, upload.text
        assert sandbox.files.read("/home/user/uploaded.txt") == "uploaded by URL"

        # A URL signed for reading does not write.
        refused = httpx.post(url, headers=host, files=form)
        assert refused.status_code == 401
    finally:
        sandbox.kill()


def test_create_envs_reach_commands_and_a_commands_envs_win(sdk: dict[str, Any]) -> None:
    sandbox = create_sandbox(sdk, envs={"FOO": "bar", "OTHER": "kept"})
    try:
        assert sandbox.commands.run("echo $FOO").stdout == "bar\n"
        assert sandbox.commands.run("echo $FOO", envs={"FOO": "baz"}).stdout == "baz\n"
        # per command: the next one sees the sandbox's value again, and the rest of it
        assert sandbox.commands.run('echo "$FOO $OTHER"').stdout == "bar kept\n"
        handle = sandbox.commands.run("echo $FOO", background=True)
        assert handle.wait().stdout == "bar\n"
    finally:
        sandbox.kill()


def test_a_sandbox_created_without_envs_has_none(sdk: dict[str, Any]) -> None:
    with_env = create_sandbox(sdk, envs={"FOO": "bar"})
    plain = create_sandbox(sdk)
    try:
        assert plain.commands.run('echo "[$FOO]"').stdout == "[]\n"
    finally:
        plain.kill()
        with_env.kill()


def test_env_values_are_not_listed_and_bad_names_are_refused(sdk: dict[str, Any]) -> None:
    secret = "s3cr3t-value-" + "q" * 16
    sandbox = create_sandbox(sdk, envs={"API_KEY": secret})
    headers = {"X-API-Key": sdk["api_key"]}
    try:
        for path in ("/v2/sandboxes", "/sandboxes", f"/sandboxes/{sandbox.sandbox_id}"):
            response = httpx.get(sdk["api_url"] + path, headers=headers)
            assert response.status_code == 200
            assert secret not in response.text
    finally:
        sandbox.kill()

    refused = httpx.post(
        sdk["api_url"] + "/sandboxes",
        headers=headers,
        json={"templateID": "base", "envVars": {"1X": "v"}},
    )
    assert refused.status_code == 400
    assert refused.json() == {
        "code": 400,
        "message": "envVars: '1X' is not a variable name (letters, digits and _, "
        "not starting with a digit)",
    }
