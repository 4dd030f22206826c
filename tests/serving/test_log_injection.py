"""What a client chose cannot forge a log line, nor drive a terminal.

The attack as it was found: a request path with ``%0A`` and a fake log line after it,
sent with a short body and a hang-up, to a real agent (``serve-sandboxd``): its body cap
logs the decoded path, which wrote the fake line as a line of its own."""

from __future__ import annotations

import io
import logging
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxctl.cli.logs import EscapedRecord, escape
from tests.sandboxd.servers import agent_process, free_port, sandboxes_unavailable, wait_until

FORGED = "2026-11-30 05:20:23,011 INFO sandbox sb_0123456789ab claimed by admin"
NEEDS_AGENT = pytest.mark.skipif(
    sandboxes_unavailable() is not None, reason=sandboxes_unavailable() or ""
)


@pytest.fixture
def escaped_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    """A logger whose records are made as every service makes them, into a buffer."""
    before = logging.getLogRecordFactory()
    logging.setLogRecordFactory(EscapedRecord)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("tests.serving.escaped")
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.INFO)
    try:
        yield log, stream
    finally:
        log.removeHandler(handler)
        logging.setLogRecordFactory(before)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("a\nb", "a\\nb"),
        ("a\r\nb", "a\\r\\nb"),
        ("tab\there", "tab\\there"),
        ("\x1b[2J\x1b]0;title\x07", "\\x1b[2J\\x1b]0;title\\x07"),
        ("nul\x00 del\x7f c1\x85\x9b", "nul\\x00 del\\x7f c1\\x85\\x9b"),
        ("line\u2028para\u2029", "line\\u2028para\\u2029"),
        ("bidi\u202eevil\u2066", "bidi\\u202eevil\\u2066"),
        ("lone \udc80", "lone \\udc80"),
        ("plain /v1/sandboxes/sb_1 é ü 日本", "plain /v1/sandboxes/sb_1 é ü 日本"),
    ],
)
def test_control_characters_are_escaped(raw: str, shown: str) -> None:
    assert escape(raw) == shown


def test_a_record_is_one_line_whatever_its_arguments_hold(escaped_log) -> None:  # type: ignore[no-untyped-def]
    log, stream = escaped_log
    log.info("POST %s: the client hung up", f"/v1/claim\n{FORGED}")
    log.warning(f"metadata {{'a': 'x\r{FORGED}'}} and \x1b[31m red")  # in the format itself
    assert stream.getvalue().splitlines() == [
        f"INFO POST /v1/claim\\n{FORGED}: the client hung up",
        f"WARNING metadata {{'a': 'x\\r{FORGED}'}} and \\x1b[31m red",
    ]


def test_a_traceback_stays_multi_line_and_its_messages_are_escaped(escaped_log) -> None:  # type: ignore[no-untyped-def]
    log, stream = escaped_log

    def route(claim_ref: str) -> None:
        try:
            raise KeyError(claim_ref)
        except KeyError as error:
            raise ValueError(f"no claim {claim_ref}") from error

    try:
        route(f"team-a\n{FORGED}")
    except ValueError:
        log.exception("claim %s failed", f"x\n{FORGED}")
    lines = stream.getvalue().splitlines()
    assert lines[0] == f"ERROR claim x\\n{FORGED} failed"
    assert "Traceback (most recent call last):" in lines
    assert any(line.startswith("  File ") and "in route" in line for line in lines)
    assert f"ValueError: no claim team-a\\n{FORGED}" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert not [line for line in lines if line.startswith(FORGED)]


def _send_and_hang_up(address: str, path: str) -> None:
    """A request head with ``path``, a body shorter than announced, then a hang-up."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n"
        )
        sock.sendall(head.encode() + b'{"templ')


@NEEDS_AGENT
def test_a_forged_line_in_a_path_does_not_reach_the_agent_log(
    state_dir: Path, uid_base: int
) -> None:
    address = f"127.0.0.1:{free_port()}"
    args = ["--listen", address, "--state-dir", str(state_dir / "sd"), "--uid-base", str(uid_base)]
    encoded = FORGED.replace(" ", "%20")
    with (
        tempfile.NamedTemporaryFile(prefix="agent-log-") as output,
        agent_process(args, address, output=output),
    ):
        _send_and_hang_up(address, f"/v1/claim%0A{encoded}%0D%0A%1B[2J")

        def hung_up_line() -> list[str]:
            text = Path(output.name).read_text(errors="replace")
            return [line for line in text.splitlines() if "hung up" in line]

        [line] = wait_until(hung_up_line, what="the agent to log the hang-up")
        lines = Path(output.name).read_text(errors="replace").splitlines()
    assert line.endswith(
        f"INFO POST /v1/claim\\n{FORGED}\\r\\n\\x1b[2J: the client hung up while sending its body"
    )
    assert not [text for text in lines if text.startswith(FORGED)]
    assert not [text for text in lines if "\x1b" in text]
