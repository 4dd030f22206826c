"""The unsafe-process runtime: sandboxes as plain host processes, for development only.

Each sandbox is ``sleep infinity`` in a session of its own, running as the sandbox's
uid (no supplementary groups, NoNewPrivs) with its home directory as cwd, HOME and
TMPDIR (``HOME/.tmp``), under rlimits: RLIMIT_AS = memory (per process) and
RLIMIT_NPROC = max_processes (per uid, so per sandbox). That is all. See ``WARNING``
for what it lacks; the agent logs it at startup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from sandboxctl.envd.host import SANDBOX_HOME, Command, Entry
from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.bubblewrap import (
    FREEZE_TIMEOUT,
    LAUNCHERS,
    START_TIMEOUT,
    STOP_TIMEOUT,
    check_path,
    find_tools,
    make_home,
    open_files,
    prlimit_args,
    read_available,
    read_some,
    ready_script,
    remove_home,
    stop_all,
)
from sandboxctl.sandboxd.entering import HOST_ENV, command_script, shim_argv
from sandboxctl.sandboxd.runtime import Identity, RuntimeFailure, SandboxSpec

WARNING = (
    "the unsafe-process runtime does NOT isolate sandboxes: they are plain host processes "
    "with no pid, mount, network, ipc or uts namespace. A sandbox sees every host "
    "process, can read every host file its uid may read (the whole host filesystem under "
    "normal permissions) and write wherever its uid may, uses the host network (net=none "
    "is ignored) and the host's /tmp and /etc. It is kept apart from other sandboxes only "
    "by its own uid and a 0700 home; limits are rlimits (memory per process, process "
    "count per uid, no CPU limit) and freezing is SIGSTOP/SIGCONT. Development only."
)

TMP_DIR = ".tmp"  # the sandbox's /tmp, inside its home


class UnsafeProcessRuntime:
    """Runtime protocol without isolation (see ``WARNING``)."""

    name = "unsafe-process"
    isolated = False
    TOOLS = ("setpriv", "prlimit")
    limits_mode = "rlimit"
    freeze_mode = "signals"

    def __init__(
        self, *, start_timeout: float = START_TIMEOUT, stop_timeout: float = STOP_TIMEOUT
    ) -> None:
        self._tools = find_tools(self.TOOLS)
        self._start_timeout = start_timeout
        self._stop_timeout = stop_timeout
        self._launchers = LAUNCHERS

    def start(self, spec: SandboxSpec) -> Identity:
        self._launchers.reap()
        try:
            make_home(spec)
            tmp = spec.home / TMP_DIR
            with contextlib.suppress(FileExistsError):
                tmp.mkdir(mode=0o700)
            os.chown(tmp, spec.uid, spec.uid)
        except OSError as exc:
            self._cleanup_quietly(spec)
            raise RuntimeFailure(f"sandbox {spec.id}: cannot prepare: {exc}") from exc
        ready_r, ready_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            try:
                proc = subprocess.Popen(
                    [
                        *self._as_uid(spec),
                        "/bin/sh",
                        "-c",
                        ready_script(spec.limits),
                    ],
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=ready_w,
                    stderr=err_w,
                    cwd=spec.home,
                    env={**HOST_ENV, **self._home_env(spec)},
                )
            finally:
                os.close(ready_w)
                os.close(err_w)
            self._launchers.add(spec.id, proc)
            ready = read_some(ready_r, time.monotonic() + self._start_timeout)
            identity = procfs.identity_of(proc.pid) if ready == b"R" else None
            if identity is None:
                raise RuntimeFailure(f"sandbox {spec.id} did not start")
        except (RuntimeFailure, OSError) as exc:
            detail = read_available(err_r)
            self._cleanup_quietly(spec)
            raise RuntimeFailure(
                f"sandbox {spec.id} did not start: {exc}" + (f": {detail}" if detail else "")
            ) from exc
        except BaseException:  # a bug or an interrupt: still leave nothing behind
            self._cleanup_quietly(spec)
            raise
        finally:
            os.close(ready_r)
            os.close(err_r)
        return identity

    def alive(self, identity: Identity) -> bool:
        self._launchers.reap()
        return procfs.matches(identity)

    def freeze(self, spec: SandboxSpec, identity: Identity) -> None:
        self._require_alive(spec, identity)
        stop_all(lambda: procfs.pids_of_uid(spec.uid), FREEZE_TIMEOUT)

    def thaw(self, spec: SandboxSpec, identity: Identity) -> None:
        self._require_alive(spec, identity)
        procfs.signal_pids(procfs.pids_of_uid(spec.uid), signal.SIGCONT)

    def destroy(self, spec: SandboxSpec, identity: Identity | None) -> None:
        try:
            if identity is not None:
                procfs.signal_identity(identity, signal.SIGKILL)
            procfs.kill_uid(spec.uid, self._stop_timeout)
            self._launchers.wait(spec.id, self._stop_timeout)
            remove_home(spec)
        except OSError as exc:
            raise RuntimeFailure(f"sandbox {spec.id}: cannot destroy: {exc}") from exc
        finally:
            self._launchers.reap()

    def enter(self, spec: SandboxSpec, identity: Identity, command: Command) -> Entry:
        """``command`` as the sandbox uid, under its rlimits, with HOME and TMPDIR in its
        home directory (over the command's own); its cwd is mapped as ``host_path``
        maps paths (``/home/user`` is the home directory)."""
        self._require_alive(spec, identity)
        script = command_script(
            command,
            cwd=str(self.host_path(spec, identity, command.cwd)),
            overrides=self._home_env(spec),
            open_files=open_files(spec.limits),
        )
        return Entry([*self._as_uid(spec), *shim_argv()], HOST_ENV, script)

    def host_path(self, spec: SandboxSpec, identity: Identity, path: str) -> Path:
        """/home/user/... is the home directory, /tmp/... is HOME/.tmp/..., and any
        other path is that same host path: there is no filesystem of the sandbox's own,
        so write only as the sandbox uid."""
        parts = check_path(path)
        home_parts = check_path(SANDBOX_HOME)
        if parts[: len(home_parts)] == home_parts:
            return spec.home.joinpath(*parts[len(home_parts) :])
        if parts[:1] == ["tmp"]:
            return (spec.home / TMP_DIR).joinpath(*parts[1:])
        return Path("/").joinpath(*parts)

    # --- internals -----------------------------------------------------------------------

    def _as_uid(self, spec: SandboxSpec) -> list[str]:
        return [
            *prlimit_args(self._tools["prlimit"], spec.limits),
            self._tools["setpriv"],
            f"--reuid={spec.uid}",
            f"--regid={spec.uid}",
            "--clear-groups",
            "--no-new-privs",
            "--",
        ]

    def _home_env(self, spec: SandboxSpec) -> dict[str, str]:
        return {"HOME": str(spec.home), "TMPDIR": str(spec.home / TMP_DIR)}

    def _require_alive(self, spec: SandboxSpec, identity: Identity) -> None:
        if not procfs.matches(identity):
            raise RuntimeFailure(f"sandbox {spec.id} is not running")

    def _cleanup_quietly(self, spec: SandboxSpec) -> None:
        with contextlib.suppress(RuntimeFailure, OSError):
            self.destroy(spec, None)
