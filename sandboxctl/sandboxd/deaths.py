"""Noticing at once that a sandbox's init has exited, without polling any sandbox.

A sandbox ends when its init exits: killed from inside (its ``sleep`` gone, which ends the
init), by the OOM killer, or by anyone with the rights. The agent holds a pidfd of every
sandbox's init; a pidfd becomes readable when its process exits, and one thread waits on
all of them with epoll, so a death is seen within milliseconds at no cost while nothing
dies. The pidfd is taken and then checked against the sandbox's identity, so a recycled
pid is never mistaken for the sandbox (a sandbox already gone by then is reported too).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import threading
from collections.abc import Callable

from sandboxctl.sandboxd import procfs
from sandboxctl.sandboxd.runtime import Identity

log = logging.getLogger("sandboxctl.sandboxd")


class DeathWatch:
    """Calls ``on_death(sandbox_id)`` from its own thread once a watched sandbox's init
    has exited. Thread-safe; ``watch`` and ``forget`` may be called from any thread,
    ``on_death`` included."""

    def __init__(self, on_death: Callable[[str], None]) -> None:
        self._on_death = on_death
        self._lock = threading.Lock()
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._by_id: dict[str, int] = {}  # sandbox id -> pidfd
        self._by_fd: dict[int, str] = {}
        self._gone: list[str] = []  # already dead when watched
        self._stopping = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sandbox deaths", daemon=True)
        self._thread.start()

    def watch(self, sandbox_id: str, identity: Identity) -> None:
        """Watch the init ``identity`` names (again, if watched already)."""
        self.forget(sandbox_id)
        try:
            pidfd = os.pidfd_open(identity.pid)
        except OSError:  # gone already (ESRCH), or a pid we may not hold
            pidfd = -1
        with self._lock:
            if self._stopping:
                if pidfd >= 0:
                    os.close(pidfd)
                return
            if pidfd < 0 or not procfs.matches(identity):
                if pidfd >= 0:
                    os.close(pidfd)
                self._gone.append(sandbox_id)
                os.write(self._wake_w, b"!")
                return
            self._by_id[sandbox_id] = pidfd
            self._by_fd[pidfd] = sandbox_id
            self._epoll.register(pidfd, select.EPOLLIN)

    def forget(self, sandbox_id: str) -> None:
        """Stop watching a sandbox (the agent destroys it, or it was reported)."""
        with self._lock:
            pidfd = self._by_id.pop(sandbox_id, None)
            if pidfd is not None:
                del self._by_fd[pidfd]
                self._epoll.unregister(pidfd)
                os.close(pidfd)

    def stop(self) -> None:
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
            os.write(self._wake_w, b"!")
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._lock:
            for pidfd in self._by_fd:
                os.close(pidfd)
            self._by_fd.clear()
            self._by_id.clear()
            self._epoll.close()
            os.close(self._wake_r)
            os.close(self._wake_w)

    def _run(self) -> None:
        while True:
            events = self._epoll.poll()
            dead: list[str] = []
            with self._lock:
                if self._stopping:
                    return
                for fd, _ in events:
                    if fd == self._wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                        dead.extend(self._gone)
                        self._gone.clear()
                    elif fd in self._by_fd:
                        dead.append(self._by_fd[fd])
            for sandbox_id in dead:
                self.forget(sandbox_id)
                try:
                    self._on_death(sandbox_id)
                except Exception:  # one bad cleanup must not blind the watch
                    log.exception("handling the death of sandbox %s failed", sandbox_id)
