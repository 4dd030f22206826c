"""Commands into a sandbox with nothing of the client's on the host.

What a client asks to run (argv, environment, working directory) is hostile. The host
helpers that enter a sandbox run as root (the shell that joins the cgroups, prlimit,
setpriv, nsenter), and the dynamic loader, the C library and the shell read their
environment before any of our code runs: ``LD_PRELOAD``, ``LD_DEBUG`` with
``LD_DEBUG_OUTPUT``, ``GCONV_PATH``, ``BASH_ENV``, ``ENV``, ``PATH``, the locale variables.
A variable of the client's in any of them is code run as root on the host. And every local
user can read every process's command line (``ps``), so nothing secret may be there.

So every host helper runs with ``HOST_ENV`` and a command line of the runtime's own fixed
text. The command travels as a script on the process's stdin (:func:`command_script`),
read by ``SHIM``, the last program of the chain: a shell *inside* the sandbox, already the
sandbox's uid, that reads exactly the script's lines (``read`` takes a pipe one byte at a
time, so nothing after them is consumed), then evaluates them: export the variables,
point stdin where it belongs, change directory and exec the command. A command's own input
follows the script on the same pipe. Whatever the script holds runs as the tenant, where
the tenant could run it anyway.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, Final

from sandboxctl.core.envvars import is_variable_name
from sandboxctl.envd.host import SANDBOX_HOME, SANDBOX_USER, BadCommand, Command, Entry

DEFAULT_PATH: Final = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The environment of every host helper, and the base of every command's inside the
# sandbox (the client's variables are set on top by the script). Never the agent's own.
HOST_ENV: Final[Mapping[str, str]] = {
    "PATH": DEFAULT_PATH,
    "HOME": SANDBOX_HOME,
    "USER": SANDBOX_USER,
    "LOGNAME": SANDBOX_USER,
    "SHELL": "/bin/sh",
    "LANG": "C.UTF-8",
}
FAILED_TO_ENTER: Final = 125  # the exit status of a command that never got to run
# The first line is the number of lines that follow; a script cut short runs nothing.
SHIM: Final = (
    f"read -r n || exit {FAILED_TO_ENTER}; s=; "
    'while [ "$n" -gt 0 ] && IFS= read -r l; do s="$s$l\n"; n=$((n - 1)); done; '
    f'[ "$n" -eq 0 ] || exit {FAILED_TO_ENTER}; eval "$s"'
)
SHIM_NAME: Final = "sandboxctl-enter"  # the shim's $0, what ps shows of it
# Where the command's stdin goes once the script is read: the pipe stays, /dev/null, or
# the terminal the caller gave as its stdout.
_STDIN: Final = {"pipe": "", "null": "exec </dev/null", "terminal": "exec 0<&1"}


def shim_argv() -> list[str]:
    """The program the runtime's last helper execs inside the sandbox."""
    return ["/bin/sh", "-c", SHIM, SHIM_NAME]


def command_script(
    command: Command,
    cwd: str | None = None,
    overrides: Mapping[str, str] | None = None,
    open_files: int | None = None,
) -> bytes:
    """The script :data:`SHIM` runs for ``command``: its variables, then ``overrides``
    (the runtime's, set last), at most ``open_files`` open files per process, its stdin,
    ``cd`` to ``cwd`` (default: the command's; a missing one fails the command as a shell's
    ``cd`` does) and ``exec``. BadCommand names the field that cannot be passed on."""
    if not command.argv:
        raise BadCommand("the command is empty")
    lines = []
    for name, value in {**command.env, **(overrides or {})}.items():
        if not is_variable_name(name):
            raise BadCommand(f"env: {_shown(name)} is not a variable name")
        lines.append(f"export {name}={_quoted(value, f'env.{name}')}")
    if open_files is not None:
        lines.append(f"ulimit -n {int(open_files)}")
    if redirect := _STDIN[command.stdin]:
        lines.append(redirect)
    lines.append(f"cd -- {_quoted(cwd or command.cwd, 'cwd')} || exit")
    argv = " ".join(_quoted(arg, "argv") for arg in command.argv)
    inline = _shell_script(command.argv) if command.inline_shell else None
    if command.stdin == "terminal":
        # A session of its own with the terminal as its controlling tty (where the
        # sandbox has setsid -c), so Ctrl-C and a resize reach its foreground job.
        lines.append(f"command -v setsid >/dev/null 2>&1 && exec setsid -c {argv}")
        lines.append(f"exec {argv}")
    elif inline is not None:
        script, args = inline
        _quoted(script, "argv")  # the NUL check
        lines.append(" ".join(["set --", *(_quoted(arg, "argv") for arg in args)]))
        lines.append(script)
    else:
        lines.append(f"exec {argv}")
    text = "\n".join(lines) + "\n"
    try:
        return f"{text.count(chr(10))}\n{text}".encode()
    except UnicodeEncodeError:
        raise BadCommand("the command is not valid UTF-8 text") from None


def run(
    entry: Entry, timeout: float | None = None, **kwargs: Any
) -> subprocess.CompletedProcess[Any]:
    """Run an entry to completion (its script on stdin, then EOF), output captured.
    ``kwargs`` as ``subprocess.run``'s (``text=True``, ...); not ``stdin``/``input``."""
    text = bool(kwargs.get("text"))
    return subprocess.run(
        entry.argv,
        env=dict(entry.env),
        input=entry.script.decode() if text else entry.script,
        capture_output=True,
        timeout=timeout,
        start_new_session=True,
        check=False,
        **kwargs,
    )


def popen(entry: Entry, **kwargs: Any) -> subprocess.Popen[Any]:
    """Start an entry whose stdin is not a pipe (``null`` or ``terminal``): its script is
    written and its stdin closed at once. ``kwargs`` as ``subprocess.Popen``'s."""
    process = subprocess.Popen(
        entry.argv, env=dict(entry.env), stdin=subprocess.PIPE, start_new_session=True, **kwargs
    )
    assert process.stdin is not None
    try:
        write_all(process.stdin.fileno(), entry.script)
    except BrokenPipeError:  # it ended before reading: its exit status says why
        pass
    finally:
        process.stdin.close()
        process.stdin = None  # consumed: communicate() has nothing to send
    return process


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _shell_script(argv: Sequence[str]) -> tuple[str, Sequence[str]] | None:
    """(SCRIPT, ARGS) of ``/bin/sh -c SCRIPT [NAME [ARGS...]]``, else None."""
    if len(argv) >= 3 and argv[0] == "/bin/sh" and argv[1] == "-c":
        return argv[2], argv[4:]
    return None


def _quoted(value: str, field: str) -> str:
    if "\0" in value:
        raise BadCommand(f"{field}: contains a NUL byte")
    return shlex.quote(value)


def _shown(name: str) -> str:
    return repr(name if len(name) <= 64 else name[:64] + "...")
