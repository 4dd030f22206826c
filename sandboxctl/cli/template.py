"""``sandboxctl template build|list|rm``: templates built from Debian packages, in the
template store the host agents serve them from (docs/templates.md)."""

from __future__ import annotations

import enum
import json
import os
from datetime import UTC, datetime
from typing import Annotated

import typer
from rich.table import Table

from sandboxctl.cli import render
from sandboxctl.cli.options import StoreDir
from sandboxctl.core.errors import ConfigurationError, InvalidValueError
from sandboxctl.core.templates import (
    DEFAULT_SUITE,
    REQUIRED_PACKAGES,
    check_command,
    check_template_name,
    format_mib,
    split_packages,
    template_spec,
)
from sandboxctl.sandboxd.templates.build import Builder, sigterm_interrupts
from sandboxctl.sandboxd.templates.mounts import users_of
from sandboxctl.sandboxd.templates.progress import reporter
from sandboxctl.sandboxd.templates.store import (
    DEFAULT_STORE,
    Template,
    TemplateStore,
    check_store,
)

app = typer.Typer(
    name="template",
    help="Build, list and remove templates: root filesystems built from Debian packages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class Output(enum.StrEnum):
    TABLE = "table"
    JSON = "json"


@app.command("build")
def build(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The template's name: a DNS label.")],
    suite: Annotated[
        str, typer.Option("--suite", help="The Debian suite to build from.")
    ] = DEFAULT_SUITE,
    packages: Annotated[
        list[str] | None,
        typer.Option(
            "--packages",
            metavar="PKG,...",
            help="Debian packages to install (comma separated, repeatable), beside the "
            f"essential set and {', '.join(REQUIRED_PACKAGES)}.",
        ),
    ] = None,
    run: Annotated[
        list[str] | None,
        typer.Option(
            "--run",
            metavar="CMD",
            help="A shell command to run as root in the new root after the packages "
            "(repeatable, in order), with the host's network.",
        ),
    ] = None,
    start_cmd: Annotated[
        str,
        typer.Option(
            "--start-cmd", metavar="CMD", help="Run in each sandbox of it when it starts."
        ),
    ] = "",
    ready_cmd: Annotated[
        str,
        typer.Option(
            "--ready-cmd",
            metavar="CMD",
            help="A sandbox of it is ready once this exits 0 (tried until it does).",
        ),
    ] = "",
    store: StoreDir = DEFAULT_STORE,
) -> None:
    """Build a root filesystem from Debian packages with mmdebstrap (cached by its
    spec) and name it; prints its size and build time."""
    check_template_name(name)
    spec = template_spec(
        suite,
        tuple(package for text in packages or () for package in split_packages(text)),
        tuple(run or ()),
    )
    for flag, command in (("--start-cmd", start_cmd), ("--ready-cmd", ready_cmd)):
        if command:
            check_command(flag, command)
    _require_root("template build must run as root: mmdebstrap builds as root, the store is root's")
    check_store(store, "--store")
    err = render.console(stderr=True)
    shown = reporter(name, err, lambda line: err.print(line, markup=False, highlight=False))
    with sigterm_interrupts():
        outcome = Builder(TemplateStore(store), shown).build(name, spec, start_cmd, ready_cmd)
    made = outcome.template.build
    how = (
        f"cached (built {_when(made.created_at)} in {made.build_seconds:.1f}s)"
        if outcome.cached
        else f"built in {outcome.seconds:.1f}s"
    )
    typer.echo(
        f"template {name}: {how}, {format_mib(made.size_bytes)} on disk, build {made.digest[:12]} "
        f"({made.suite}: {', '.join(made.packages)}), in {store}"
    )


@app.command("list")
def list_templates(
    store: StoreDir = DEFAULT_STORE,
    output: Annotated[Output, typer.Option("--output", "-o", help="Output format.")] = (
        Output.TABLE
    ),
) -> None:
    """List the templates in the store."""
    found = TemplateStore(store).templates()
    if output is Output.JSON:
        typer.echo(json.dumps([_json(template) for template in found], indent=2))
        return
    table = Table("NAME", "BUILD", "SUITE", "PACKAGES", "RUN", "SIZE", "BUILT", "TOOK", "START")
    for template in found:
        made = template.build
        table.add_row(
            template.name,
            made.digest[:12],
            made.suite,
            ",".join(p for p in made.packages if p not in REQUIRED_PACKAGES) or "-",
            str(len(made.run)),
            format_mib(made.size_bytes),
            _when(made.created_at),
            f"{made.build_seconds:.1f}s",
            "yes" if template.start_cmd or template.ready_cmd else "-",
        )
    render.console().print(table)
    if not found:
        typer.echo(f"no templates in {store}")


@app.command("rm")
def remove(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The template to remove.")],
    store: StoreDir = DEFAULT_STORE,
    force: Annotated[
        bool,
        typer.Option("--force", help="Remove it even while sandboxes run from it (they break)."),
    ] = False,
) -> None:
    """Remove a template, and every build no other template needs."""
    _require_root("template rm must run as root: the store is root's")
    templates = TemplateStore(store)
    with templates.locked():
        if templates.get(name) is None:
            raise InvalidValueError(f"template {name!r} is not in {store}")
        doomed = templates.unneeded_without(name)
        users = sorted({pid for b in doomed for pid in users_of(templates.root_of(b.digest))})
        if users and not force:
            raise ConfigurationError(
                f"template {name!r} is in use: {len(users)} sandbox(es) run from its build "
                f"(pids {', '.join(map(str, users[:5]))}); destroy them first, or --force"
            )
        removed = templates.remove(name)
    freed = sum(build.size_bytes for build in removed)
    builds = ", ".join(build.digest[:12] for build in removed) or "none: another template uses it"
    typer.echo(f"removed template {name}; builds removed: {builds} ({format_mib(freed)} freed)")


def _require_root(message: str) -> None:
    if os.geteuid() != 0:
        raise ConfigurationError(message)


def _json(template: Template) -> dict[str, object]:
    made = template.build
    return {
        "name": template.name,
        "digest": made.digest,
        "suite": made.suite,
        "packages": list(made.packages),
        "run": list(made.run),
        "startCmd": template.start_cmd,
        "readyCmd": template.ready_cmd,
        "sizeBytes": made.size_bytes,
        "createdAt": _when(made.created_at),
        "buildSeconds": made.build_seconds,
        "tool": made.tool,
        "root": str(template.root),
    }


def _when(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
