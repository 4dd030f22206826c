"""Which template ``serve``'s sandboxes run from: by default ``default``, built from
Debian packages into the template store on the first start (about a minute, shown as it
goes) and found there by every later start, so that no sandbox sees the host's files;
``--template base`` is the host's own root, read-only, as before. Whichever it is, it is
what the e2b SDK's ``Sandbox.create()`` gets (the aliases ``base`` and
``code-interpreter-v1`` point at it) and what the warm pool holds; every other template
in the store is served too, by its name."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from rich.console import Console

from sandboxctl.apiserver.e2b.config import DEFAULT_ALIASES
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.model import PoolKey
from sandboxctl.core.templates import (
    DEFAULT_TEMPLATE,
    HOST_ROOT,
    REQUIRED_PACKAGES,
    check_template_name,
    default_spec,
    format_mib,
)
from sandboxctl.sandboxd.templates.build import Builder, sigterm_interrupts
from sandboxctl.sandboxd.templates.progress import reporter
from sandboxctl.sandboxd.templates.store import Template, TemplateStore

log = logging.getLogger("sandboxctl.serve")


def check_template(template: str, pools: Mapping[PoolKey, int], store: Path) -> None:
    """Refuse (one line, before anything starts or is bound) a ``--template`` that is not a
    name or not in the store (but ``default``, which a first start builds), and a
    ``--pool`` of a template this fleet will not serve. Writes nothing."""
    found = TemplateStore(store)
    if template != HOST_ROOT:
        check_template_name(template)
        if template != DEFAULT_TEMPLATE and found.get(template) is None:
            raise _not_in_store(template, store)
    for key in pools:
        if key.template == template or found.get(key.template) is not None:
            continue
        if key.template == HOST_ROOT:
            raise ConfigurationError(
                f"--pool {key.template}: template {HOST_ROOT!r} (the host's root "
                f"filesystem) is served only with --template {HOST_ROOT}; this fleet's "
                f"sandboxes run template {template!r}: --pool {template}=N"
            )
        raise ConfigurationError(
            f"--pool {key.template}: template {key.template!r} is not in the template store "
            f"{store} (sandboxctl template build {key.template} --store {store})"
        )


def _not_in_store(template: str, store: Path) -> ConfigurationError:
    return ConfigurationError(
        f"--template {template}: not in the template store {store} "
        f"(sandboxctl template build {template} --store {store})"
    )


def aliases(template: str) -> dict[str, tuple[str, str]]:
    """The e2b API's aliases, pointing at the fleet's template."""
    return {alias: (template, size) for alias, (_, size) in DEFAULT_ALIASES.items()}


def prepare_template(template: str, store: Path) -> str:
    """Make sure the fleet's template is there, building ``default`` on the first start;
    returns what to tell the user about it."""
    if template == HOST_ROOT:
        log.warning(
            "--template %s: sandboxes run on the host's root filesystem, read-only: every "
            "sandbox can read the host's files",
            HOST_ROOT,
        )
        return (
            f"{HOST_ROOT}: the host's root filesystem, read-only (sandboxes see the host's files)"
        )
    templates = TemplateStore(store)
    found = templates.get(template)
    if found is None and template != DEFAULT_TEMPLATE:
        raise _not_in_store(template, store)  # removed since check_template
    if found is None:
        log.info(
            "template %s is not in %s yet: building it from Debian packages, once (the "
            "next start finds it there)",
            template,
            store,
        )
        shown = reporter(template, Console(stderr=True), log.info)
        with sigterm_interrupts():  # a stop while it builds leaves nothing half built
            outcome = Builder(templates, shown).build(template, default_spec())
        found = outcome.template
        log.info(
            "template %s: built in %.1fs, %s on disk, in %s",
            template,
            outcome.seconds,
            format_mib(found.build.size_bytes),
            store,
        )
    else:
        log.info(
            "template %s: build %s, %s on disk, from %s",
            template,
            found.build.digest[:12],
            format_mib(found.build.size_bytes),
            store,
        )
    return _described(found)


def _described(template: Template) -> str:
    build = template.build
    extra = [p for p in build.packages if p not in REQUIRED_PACKAGES]
    return (
        f"{template.name}: Debian {build.suite} ({', '.join(extra) or 'essential'}), "
        f"{format_mib(build.size_bytes)} (sandboxes do not see the host's files)"
    )
