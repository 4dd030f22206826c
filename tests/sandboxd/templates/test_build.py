"""``sandboxctl template build|list|rm`` as a user runs them, on a real store: a build of a
spec the store has is instant; bad input is one line, exit 2, and leaves the store as it
was; a removal never pulls a root from under a running sandbox."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from sandboxctl.core.templates import DEFAULT_PACKAGES, REQUIRED_PACKAGES
from sandboxctl.sandboxd.templates.store import Template, TemplateStore
from tests.cli.conftest import Run
from tests.sandboxd.servers import wait_until
from tests.sandboxd.templates.helpers import store_entries

PACKAGES = ",".join(DEFAULT_PACKAGES)


def test_a_build_of_a_spec_the_store_has_is_cached(
    run: Run, store: Path, default: Template
) -> None:
    done = run("template", "build", "tiny", "--packages", PACKAGES, "--store", str(store))
    assert done.code == 0, done.err
    digest = default.build.digest
    assert done.out.startswith("template tiny: cached (built ")
    assert f"MiB on disk, build {digest[:12]} (bookworm: " in done.out
    listed = json.loads(run("template", "list", "-o", "json", "--store", str(store)).out)
    [tiny] = [t for t in listed if t["name"] == "tiny"]
    assert tiny["digest"] == digest
    assert tiny["packages"] == sorted({*DEFAULT_PACKAGES, *REQUIRED_PACKAGES})
    assert tiny["sizeBytes"] > 50 << 20  # a Debian root with python3
    assert Path(tiny["root"], "usr/bin/python3").exists()
    assert store_entries(store)["builds"] == [digest]  # one build, two names


def test_a_name_that_is_no_dns_label_is_refused(run: Run, store: Path) -> None:
    before = store_entries(store)
    done = run("template", "build", "My_Template", "--store", str(store))
    assert done.code == 2
    assert done.err.strip().splitlines() == [
        "sandboxctl: error: template name 'My_Template' is not a DNS label: 1 to 63 lowercase "
        "letters, digits and '-', starting and ending with a letter or digit"
    ]
    assert store_entries(store) == before


def test_an_unknown_package_is_refused_and_nothing_is_left(run: Run, store: Path) -> None:
    before = store_entries(store)
    done = run(
        "template", "build", "nope", "--packages", "procps,no-such-package-sandboxctl",
        "--store", str(store),
    )  # fmt: skip
    assert done.code == 2, done.err
    assert done.err.strip().splitlines()[-1] == (
        "sandboxctl: error: --packages: unknown package 'no-such-package-sandboxctl' in "
        "bookworm (from http://deb.debian.org/debian)"
    )
    assert store_entries(store) == before


def test_a_failing_run_command_is_refused_and_nothing_is_left(
    run: Run, store: Path, default: Template
) -> None:
    before = store_entries(store)
    done = run(
        "template", "build", "broken", "--packages", PACKAGES,
        "--run", "echo one > /etc/one", "--run", "echo about to fail; exit 3",
        "--store", str(store),
    )  # fmt: skip
    assert done.code == 2, done.err
    assert done.err.strip().splitlines()[-1] == (
        "sandboxctl: error: --run 'echo about to fail; exit 3' failed with exit code 3: "
        "about to fail"
    )
    assert store_entries(store) == before
    assert not (default.root / "etc/one").exists()  # it ran on a copy


def test_run_commands_build_on_the_packages_build(run: Run, store: Path, default: Template) -> None:
    done = run(
        "template", "build", "marked", "--packages", PACKAGES,
        "--run", "echo from-run > /etc/marker && python3 -c 'import json'",
        "--store", str(store),
    )  # fmt: skip
    assert done.code == 0, done.err
    templates = TemplateStore(store)
    marked = templates.get("marked")
    assert marked is not None
    assert marked.build.base == default.build.digest
    assert (marked.root / "etc/marker").read_text() == "from-run\n"
    assert not (default.root / "etc/marker").exists()
    # Removed, its layer goes and the packages build stays: the default template uses it.
    removed = run("template", "rm", "marked", "--store", str(store))
    assert removed.code == 0, removed.err
    assert f"builds removed: {marked.build.digest[:12]}" in removed.out
    assert store_entries(store)["builds"] == [default.build.digest]


def test_a_removed_template_takes_its_build_only_when_nobody_needs_it(
    run: Run, store: Path, default: Template
) -> None:
    twin = run("template", "build", "twin", "--packages", PACKAGES, "--store", str(store))
    assert twin.code == 0, twin.err
    first = run("template", "rm", "twin", "--store", str(store))
    assert first.code == 0, first.err
    assert "builds removed: none: another template uses it" in first.out
    assert default.root.is_dir()
    second = run("template", "rm", "default", "--store", str(store))
    assert second.code == 0, second.err
    assert f"builds removed: {default.build.digest[:12]}" in second.out
    assert store_entries(store) == {"top": [], "builds": [], "templates": []}
    listed = run("template", "list", "--store", str(store))
    assert f"no templates in {store}" in listed.out
    missing = run("template", "rm", "default", "--store", str(store))
    assert missing.code == 2
    assert missing.err.strip() == f"sandboxctl: error: template 'default' is not in {store}"


def test_a_template_in_use_is_not_removed(run: Run, store: Path, default: Template) -> None:
    # What a sandbox holds: the build's root bound as / in a mount namespace of its own.
    holder = subprocess.Popen(
        ["bwrap", "--ro-bind", str(default.root), "/", "--proc", "/proc", "--dev", "/dev",
         "--unshare-pid", "--die-with-parent", "sleep", "60"],
    )  # fmt: skip
    try:
        wait_until(lambda: _bound(default.root), what="the root bound in a namespace")
        refused = run("template", "rm", "default", "--store", str(store))
        assert refused.code == 2
        assert refused.err.strip().startswith(
            "sandboxctl: error: template 'default' is in use: 1 sandbox(es) run from its build"
        )
        assert TemplateStore(store).get("default") is not None
        forced = run("template", "rm", "default", "--force", "--store", str(store))
        assert forced.code == 0, forced.err
        assert TemplateStore(store).get("default") is None
    finally:
        holder.kill()
        holder.wait()


def test_an_interrupted_build_leaves_nothing(store: Path) -> None:
    before = store_entries(store)
    build = subprocess.Popen(
        [sys.executable, "-m", "sandboxctl", "template", "build", "slow",
         "--packages", "procps,hello", "--store", str(store)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert build.stdout is not None
    seen = []
    for line in build.stdout:  # the line of the step after the package lists
        seen.append(line)
        if "step 2/6" in line:
            break
    assert any("step 2/6: downloading the packages" in line for line in seen), seen
    build.send_signal(signal.SIGINT)
    rest = build.communicate(timeout=90)[0]
    assert build.returncode == 130, [*seen, rest]
    assert store_entries(store) == before  # no scratch left, nothing mounted in it
    assert str(store) not in Path("/proc/self/mountinfo").read_text()


def test_a_build_killed_outright_is_cleaned_up_by_the_next(
    run: Run, store: Path, default: Template
) -> None:
    leftover = store / ".build-killed"
    (leftover / "root" / "etc").mkdir(parents=True)
    (leftover / "root" / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    done = run("template", "build", "again", "--packages", PACKAGES, "--store", str(store))
    assert done.code == 0, done.err
    assert not leftover.exists()


def _bound(root: Path) -> bool:
    """Whether some process has ``root`` mounted as its ``/`` (read from mountinfo)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                table = Path(f"/proc/{entry}/mountinfo").read_text()
            except OSError:
                continue
            if f" {root} / " in table:
                return True
    return False
