"""Building a template: a Debian root filesystem made by mmdebstrap from the mirror this
machine's apt uses, into a template store, content-addressed and cached.

How (as root, the store's lock held; see docs/templates.md):

1. The digest of the spec (suite, packages, run commands, mmdebstrap's version, the
   recipe). A build of that digest in the store is the answer: naming it is instant.
2. Else the packages: ``mmdebstrap --variant=custom --include='?essential' --include=PKGS``
   into a scratch directory beside the store (an unknown package fails within seconds,
   before anything is installed), without man pages, translations and docs (copyright
   files kept). Its ``/etc/hostname``, ``/etc/hosts`` and ``/etc/resolv.conf`` are
   replaced by the sandbox's own (mmdebstrap copies the host's).
3. Run commands run on a copy of the packages build (itself kept in the store, so a new
   command does not download anything again), each as root in bubblewrap (``/`` the new
   root, its own /proc, /dev and /tmp, the host's network and resolver), in order.
4. The root is checked for what the sandbox runtime needs, measured, and renamed into
   ``builds/DIGEST`` at once. Any failure removes the scratch directory: nothing half
   built is ever in the store.
"""

from __future__ import annotations

import collections
import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sandboxctl.core.aptsources import AptSource, mirror_lines, parse_deb822, parse_one_line
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.templates import TemplateSpec
from sandboxctl.sandboxd.bubblewrap import MOUNT_POINTS
from sandboxctl.sandboxd.entering import DEFAULT_PATH
from sandboxctl.sandboxd.templates.mounts import remove_tree
from sandboxctl.sandboxd.templates.progress import Quiet, Reporter
from sandboxctl.sandboxd.templates.store import ROOT, Build, Template, TemplateStore, size_on_disk

APT_DIR = Path("/etc/apt")
# Paths dpkg leaves out of every template (as Debian's slim images do), and what it keeps.
EXCLUDED = ("/usr/share/man/*", "/usr/share/locale/*", "/usr/share/doc/*", "/usr/share/info/*")
KEPT = ("/usr/share/doc/*/copyright",)
# mmdebstrap's own progress lines ("I: running apt-get update...") and what we call them.
PHASES = {
    "running apt-get update": "fetching the package lists",
    "downloading packages": "downloading the packages",
    "extracting archives": "unpacking",
    "installing essential packages": "installing the packages",
    "cleaning package lists": "cleaning up",
}
PACKAGE_STEPS = len(PHASES) + 1  # and finishing the root
UNKNOWN_PACKAGE = ("Unable to locate package ", "has no installation candidate")
NO_SUITE = "does not have a Release file"
OUTPUT_TAIL = 40
STOP_GRACE = 30.0  # for mmdebstrap to unmount and end once stopped, before SIGKILL
# What a sandbox runs, beyond the mount points bubblewrap needs (why, for the message).
NEEDED = {
    "bin/sh": "every command runs under /bin/sh",
    "bin/bash": "the e2b SDK's commands run /bin/bash",
    "usr/bin/python3": "envd's filesystem calls run a python3 helper",
    "usr/bin/setsid": "a pty's job control runs setsid (util-linux)",
}
HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"


@dataclass(frozen=True, slots=True)
class Outcome:
    template: Template
    cached: bool  # the build was in the store already
    seconds: float  # what this call took


def tool_version() -> str:
    """``mmdebstrap 1.3.5``: part of every digest."""
    if shutil.which("mmdebstrap", path=DEFAULT_PATH) is None:
        raise ConfigurationError(
            "mmdebstrap not found: install it (apt-get install mmdebstrap; make host-tools does)"
        )
    result = subprocess.run(
        ["mmdebstrap", "--version"], capture_output=True, text=True, check=False
    )
    version = result.stdout.strip()
    if result.returncode != 0 or not version:
        raise ConfigurationError(f"mmdebstrap --version failed: {result.stderr.strip()}")
    return version


def host_sources(apt_dir: Path = APT_DIR) -> list[AptSource]:
    """The entries of this machine's apt sources, in apt's order."""
    found = []
    one_line = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*.list"))]
    for file in one_line:
        if file.is_file():
            found += parse_one_line(file.read_text(errors="replace"))
    for file in sorted((apt_dir / "sources.list.d").glob("*.sources")):
        found += parse_deb822(file.read_text(errors="replace"))
    return found


class Builder:
    """Builds specs into one store, showing its steps to ``reporter``."""

    def __init__(
        self, store: TemplateStore, reporter: Reporter | None = None, apt_dir: Path = APT_DIR
    ) -> None:
        self.store = store
        self.reporter = reporter or Quiet()
        self.apt_dir = apt_dir
        self._lock_fd = -1  # the store's lock, held while a build runs

    def build(
        self, name: str, spec: TemplateSpec, start_cmd: str = "", ready_cmd: str = ""
    ) -> Outcome:
        """Name the build of ``spec`` ``name`` (building it unless the store has it)."""
        started = time.monotonic()
        tool = tool_version()
        digest = spec.digest(tool)
        with self.store.locked() as self._lock_fd:
            found = self.store.build(digest)
            cached = found is not None
            if found is None:
                try:
                    found = self._build(spec, tool)
                finally:
                    self.reporter.end()
            template = self.store.name(name, found.digest, start_cmd, ready_cmd, time.time())
        return Outcome(template, cached, time.monotonic() - started)

    # --- internals -------------------------------------------------------------------------

    def _build(self, spec: TemplateSpec, tool: str) -> Build:
        base = spec.base()
        packages = self.store.build(base.digest(tool))
        steps = (0 if packages else PACKAGE_STEPS) + (len(spec.run) + 2 if spec.run else 0)
        self.reporter.begin(steps)
        if packages is None:
            packages = self._packages(base, tool)
        if not spec.run:
            return packages
        return self._layer(spec, tool, packages)

    def _packages(self, spec: TemplateSpec, tool: str) -> Build:
        mirror = mirror_lines(
            host_sources(self.apt_dir), spec.suite, f"{self.apt_dir}/sources.list*"
        )
        started = time.monotonic()
        with self._scratch() as scratch:
            root = scratch / ROOT
            self._mmdebstrap(spec, mirror, root)
            self.reporter.step("finishing the root")
            _finish(root)
            return self._commit(scratch, spec, tool, mirror, "", started)

    def _layer(self, spec: TemplateSpec, tool: str, packages: Build) -> Build:
        started = time.monotonic()
        with self._scratch() as scratch:
            root = scratch / ROOT
            self.reporter.step("copying the packages build")
            _copy(self.store.root_of(packages.digest), root)
            for number, command in enumerate(spec.run, start=1):
                self.reporter.step(f"--run {number}/{len(spec.run)}: {command}")
                self._run(root, command)
            self.reporter.step("finishing the root")
            return self._commit(scratch, spec, tool, packages.mirror, packages.digest, started)

    def _commit(
        self,
        scratch: Path,
        spec: TemplateSpec,
        tool: str,
        mirror: Sequence[str],
        base: str,
        started: float,
    ) -> Build:
        root = scratch / ROOT
        _check(root)
        build = Build(
            digest=spec.digest(tool),
            suite=spec.suite,
            packages=spec.packages,
            run=spec.run,
            base=base,
            tool=tool,
            mirror=tuple(mirror),
            created_at=time.time(),
            build_seconds=round(time.monotonic() - started, 1),
            size_bytes=size_on_disk(root),
        )
        self.store.commit(scratch, build)
        return build

    def _scratch(self) -> _Scratch:
        return _Scratch(self.store)

    def _mmdebstrap(self, spec: TemplateSpec, mirror: Sequence[str], root: Path) -> None:
        argv = [
            "mmdebstrap",
            "--variant=custom",
            "--mode=root",
            "--format=directory",
            "--include=?essential",
            "--include=" + ",".join(spec.packages),
            *(f"--dpkgopt=path-exclude={path}" for path in EXCLUDED),
            *(f"--dpkgopt=path-include={path}" for path in KEPT),
            spec.suite,
            str(root),
            *mirror,
        ]

        def progress(line: str) -> None:
            if line.startswith("I: "):
                phase = next((v for k, v in PHASES.items() if line[3:].startswith(k)), None)
                if phase is not None:
                    self.reporter.step(phase)

        code, tail = run_streaming(argv, progress, self._lock_fd)
        if code != 0:
            raise _mmdebstrap_failure(code, tail, spec, mirror)

    def _run(self, root: Path, command: str) -> None:
        argv = [
            shutil.which("bwrap", path=DEFAULT_PATH) or "bwrap",
            "--bind", str(root), "/",
            "--proc", "/proc",
            "--dev", "/dev",
            "--tmpfs", "/tmp",
            "--tmpfs", "/run",
            "--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--hostname", "template-build",
            "--die-with-parent",
            "--chdir", "/",
            "--clearenv",
            "--setenv", "PATH", DEFAULT_PATH,
            "--setenv", "HOME", "/root",
            "--setenv", "LANG", "C.UTF-8",
            "--setenv", "DEBIAN_FRONTEND", "noninteractive",
            "--", "/bin/sh", "-c", command,
        ]  # fmt: skip
        code, tail = run_streaming(argv, self.reporter.detail, self._lock_fd)
        if code != 0:
            last = next((line for line in reversed(tail) if line.strip()), "")
            raise InvalidValueError(
                f"--run {command!r} failed with exit code {code}"
                + (f": {last.strip()}" if last else "")
            )


class _Scratch:
    """A scratch directory in the store, removed (mounts detached first) unless the
    build was committed, i.e. renamed away."""

    def __init__(self, store: TemplateStore) -> None:
        self.path = store.scratch()

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *_: object) -> None:
        if self.path.exists():
            remove_tree(self.path)


def run_streaming(
    argv: list[str], on_line: Callable[[str], None], lock_fd: int
) -> tuple[int, list[str]]:
    """Run ``argv``, handing each line of its output (stdout and stderr) to ``on_line``;
    its exit status and its last lines. An interrupt stops it and waits for it (so
    mmdebstrap unmounts what it mounted) before going on. It holds the store's lock
    (``lock_fd``) too: if sandboxctl is killed outright, the next build waits for it."""
    tail: collections.deque[str] = collections.deque(maxlen=OUTPUT_TAIL)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        env={"PATH": DEFAULT_PATH, "LC_ALL": "C.UTF-8", "HOME": "/root"},
        pass_fds=(lock_fd,),
        # A group of its own: what mmdebstrap signals to its group on a stop (and a
        # terminal's Ctrl-C) must not interrupt our cleanup; we stop it ourselves.
        start_new_session=True,
    )
    assert process.stdout is not None
    try:
        for raw in process.stdout:
            line = raw.rstrip("\n")
            tail.append(line)
            on_line(line)
        return process.wait(), list(tail)
    except BaseException:
        _stop_group(process)
        raise
    finally:
        process.stdout.close()


def _stop_group(process: subprocess.Popen[str]) -> None:
    """Stop a command and everything it started (its process group: apt and dpkg under
    mmdebstrap), and wait until all of it is gone, so nothing writes into what we remove."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, STOP_GRACE)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(0.1)
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return


def _copy(source: Path, target: Path) -> None:
    """A copy of a root filesystem: owners, modes, links and device nodes kept."""
    result = subprocess.run(
        ["cp", "-a", "--reflink=auto", "--", str(source), str(target)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise ConfigurationError(f"cannot copy {source}: {result.stderr.strip()}")


def _finish(root: Path) -> None:
    """The sandbox's own hostname and hosts, and no resolver (a sandbox gets its own):
    mmdebstrap leaves the host's."""
    for name, text in (("hostname", "sandbox\n"), ("hosts", HOSTS), ("resolv.conf", "")):
        path = root / "etc" / name
        path.unlink(missing_ok=True)
        path.write_text(text)
        path.chmod(0o644)


def _check(root: Path) -> None:
    """The root has what the sandbox runtime binds and runs (a run command may have
    removed it)."""
    for inside in MOUNT_POINTS:
        if not os.path.lexists(root / inside):
            raise InvalidValueError(
                f"the built root lacks /{inside}, which every sandbox needs as a mount point"
            )
    for inside, why in NEEDED.items():
        if not os.path.lexists(root / inside):
            raise InvalidValueError(f"the built root lacks /{inside}: {why}")


def _mmdebstrap_failure(
    code: int, tail: list[str], spec: TemplateSpec, mirror: Sequence[str]
) -> Exception:
    source = mirror[0].split()[1] if mirror else "the mirror"
    for line in tail:
        if line.startswith("E: ") and any(marker in line for marker in UNKNOWN_PACKAGE):
            package = _quoted_or_last(line)
            return InvalidValueError(
                f"--packages: unknown package {package!r} in {spec.suite} (from {source})"
            )
        if line.startswith("E: ") and NO_SUITE in line:
            return InvalidValueError(f"--suite {spec.suite!r}: not on the mirror {source}")
    errors = [line[3:] for line in tail if line.startswith("E: ")]
    why = errors[0] if errors else (tail[-1] if tail else "no output")
    return ConfigurationError(f"mmdebstrap failed (exit {code}): {why}")


def _quoted_or_last(line: str) -> str:
    """The package an apt error names: quoted ('X' has no ...), else its last word."""
    if "'" in line:
        return line.split("'")[1]
    return line.split()[-1]


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a build as Ctrl-C does (KeyboardInterrupt): mmdebstrap is stopped and
    waited for, the scratch directory removed. Main thread only."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
