"""The shim that runs a command from the script on its stdin, run here as a plain host
process: what a client sends arrives exactly, and nothing of it is code the shim runs
unless it was meant to be."""

from __future__ import annotations

import subprocess

import pytest

from sandboxctl.envd.host import BadCommand, Command
from sandboxctl.sandboxd import entering

HOSTILE = [
    "plain",
    'it\'s "quoted" $HOME `id` $(id) \\n \\',
    "two\nlines\n.\n3\n",  # a line of its own that is a count, or a dot
    "\r\n\t trailing spaces   ",
    "",
    "ünïcode ✓",
]


def _run(command: Command, stdin: bytes = b"", script: bytes | None = None) -> tuple[int, str]:
    script = entering.command_script(command) if script is None else script
    done = subprocess.run(
        entering.shim_argv(),
        input=script + stdin,
        capture_output=True,
        env=dict(entering.HOST_ENV),
        timeout=30,
        check=False,
    )
    return done.returncode, done.stdout.decode()


@pytest.mark.parametrize("value", HOSTILE)
def test_variables_and_arguments_arrive_byte_for_byte(value: str) -> None:
    printed = Command(
        ["/bin/sh", "-c", 'printf "%s|%s" "$VALUE" "$1"', "sh", value],
        env={"VALUE": value},
        cwd="/",
    )
    assert _run(printed) == (0, f"{value}|{value}")


def test_the_commands_input_follows_the_script_on_the_same_pipe() -> None:
    counted = Command(["/bin/sh", "-c", "wc -c"], stdin="pipe", cwd="/")
    assert _run(counted, stdin=b"x" * 100_000) == (0, "100000\n")
    nothing = Command(["/bin/sh", "-c", "wc -c"], cwd="/")  # stdin null: what follows is lost
    assert _run(nothing, stdin=b"ignored") == (0, "0\n")


def test_a_script_cut_short_runs_nothing() -> None:
    script = entering.command_script(Command(["/bin/echo", "ran"], cwd="/"))
    status, out = _run(Command(["true"]), script=script[: len(script) - 5])
    assert (status, out) == (entering.FAILED_TO_ENTER, "")


def test_a_missing_cwd_fails_the_command_as_a_shells_cd_does() -> None:
    status, out = _run(Command(["/bin/echo", "ran"], cwd="/nowhere/at/all"))
    assert status != 0
    assert out == ""


def test_an_inline_shell_runs_its_script_with_its_arguments() -> None:
    inline = Command(
        ["/bin/sh", "-c", 'echo "$#:$1:$2"', "sh", "a b", "c"], cwd="/", inline_shell=True
    )
    assert _run(inline) == (0, "2:a b:c\n")


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (Command(["true"], env={"A-B": "x"}), "env: 'A-B' is not a variable name"),
        (Command(["true"], env={"LD_X": "a\0b"}), "env.LD_X: contains a NUL byte"),
        (Command(["echo", "a\0b"]), "argv: contains a NUL byte"),
        (Command(["true"], cwd="/tmp\0x"), "cwd: contains a NUL byte"),
        (Command(["echo", "\ud800"]), "the command is not valid UTF-8 text"),
        (Command([]), "the command is empty"),
    ],
)
def test_what_cannot_be_passed_on_is_refused_naming_its_field(
    command: Command, message: str
) -> None:
    with pytest.raises(BadCommand) as refused:
        entering.command_script(command)
    assert str(refused.value) == message
