"""The default template for the tests, built once per machine and kept between runs.

The cache is a template store outside the checkout (``SANDBOXCTL_TEMPLATE_CACHE``, else
``${XDG_CACHE_HOME:-~/.cache}/sandboxctl/templates``, like scripts/get-e2b-clients'
cache). The first run on a machine builds ``serve``'s default template into it with the
product's own builder (about a minute, its steps on stderr); later runs find it there.
Tests never serve from the cache (root's home is not for sandbox uids): ``seed`` links
the build into a test's own store, which is cheap (hard links, or a copy across
filesystems). Delete the cache to rebuild.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.templates import DEFAULT_TEMPLATE, default_spec
from sandboxctl.sandboxd.templates.build import Builder
from sandboxctl.sandboxd.templates.progress import Lines
from sandboxctl.sandboxd.templates.store import ROOT, Template, TemplateStore

CACHE_ENV = "SANDBOXCTL_TEMPLATE_CACHE"
_built: list[Template] = []
_lock = threading.Lock()


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(home) / "sandboxctl" / "templates"


def cached_default() -> Template:
    """The default template in the cache, built there the first time (skips the test,
    saying why, where it cannot be built: no mmdebstrap, no mirror, not root)."""
    with _lock:
        if not _built:
            say = Lines("template cache", lambda line: sys.stderr.write(line + "\n"))
            try:
                outcome = Builder(TemplateStore(cache_dir()), say).build(
                    DEFAULT_TEMPLATE, default_spec()
                )
            except (ConfigurationError, OSError) as error:
                pytest.skip(f"the default template cannot be built here: {error}")
            _built.append(outcome.template)
        return _built[0]


def seed(
    store: Path, name: str = DEFAULT_TEMPLATE, start_cmd: str = "", ready_cmd: str = ""
) -> Template:
    """``store`` with a template ``name`` of the default template's build (from the cache),
    with these start and ready commands."""
    cached = cached_default()
    target = TemplateStore(store)
    with target.locked():
        if target.build(cached.build.digest) is None:
            scratch = target.scratch()
            _link_or_copy(cached.root, scratch / ROOT)
            target.commit(scratch, cached.build)
        return target.name(name, cached.build.digest, start_cmd, ready_cmd, time.time())


def _link_or_copy(source: Path, target: Path) -> None:
    """Hard links where both are on one filesystem (the roots are read-only to every
    sandbox and no test writes one), else a copy."""
    linked = subprocess.run(["cp", "-al", str(source), str(target)], capture_output=True)
    if linked.returncode != 0:
        subprocess.run(["rm", "-rf", str(target)], check=True)
        subprocess.run(["cp", "-a", str(source), str(target)], check=True)
