"""The ``sandboxctl`` entry point: every verb, one-line errors, stable exit codes.

Exit codes: 0 success; 1 a lane failed (``lanes run``: some selected lane FAILed, or the
local kit did not come up); 2 bad input (a flag, a file, unsafe settings, a lane
selector); 3 a check failed (``inventory --fail-on-stale``); 130 interrupted.
"""

from __future__ import annotations

import importlib
import sys
from typing import Annotated

import typer
from typer import _click as click  # typer vendors click; its group API is typed on this copy
from typer.core import TyperGroup

from sandboxctl import __version__
from sandboxctl.core.errors import SandboxctlError

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

# Every verb: its module under sandboxctl.cli and the command function or Typer app in it.
# A verb's module is imported only when the verb runs (or help lists it): a service
# process then loads what it serves and not every other verb's stack (the API server's
# FastAPI and Kubernetes client cost a `publish` or an agent over a second at start).
VERBS: dict[str, tuple[str, str]] = {
    "inventory": ("inventory", "inventory"),
    "status": ("status", "status"),
    "simulate": ("simulate", "simulate"),
    "serve-sandboxd": ("sandboxd", "serve_sandboxd"),
    "serve-apiserver": ("apiserver", "serve_apiserver"),
    "serve-proxy": ("proxy", "serve_proxy"),
    "serve": ("serve", "serve"),
    "publish": ("publish", "publish"),
    "template": ("template", "app"),
    "guard-workers": ("guard", "app"),
    "lanes": ("lanes", "app"),
}


class _Verbs(TyperGroup):
    """The root command group, loading each verb's module on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(VERBS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in VERBS:
            return None
        module, attribute = VERBS[cmd_name]
        target = getattr(importlib.import_module(f"sandboxctl.cli.{module}"), attribute)
        command: click.Command
        if isinstance(target, typer.Typer):
            command = typer.main.get_group(target)
        else:
            single = typer.Typer(add_completion=False, rich_markup_mode=None)
            single.command(cmd_name)(target)
            command = typer.main.get_command(single)
        command.name = cmd_name
        return command


app = typer.Typer(
    name="sandboxctl",
    cls=_Verbs,
    help="Run and administer an e2b-compatible sandbox fleet.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"sandboxctl {__version__}")
        raise typer.Exit()


@app.callback(invoke_without_command=True)
def _root(
    context: typer.Context,
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version."),
    ] = False,
) -> None:
    """Run and administer an e2b-compatible sandbox fleet."""
    if context.invoked_subcommand is None:
        typer.echo(context.get_help())


def main(argv: list[str] | None = None) -> None:
    """Run the app; user errors become one line on stderr and a non-zero exit, never a trace."""
    _without_httpx_cli()
    try:
        code = app(args=argv, prog_name="sandboxctl", standalone_mode=False)
    except typer.TyperException as error:
        _fail(error.format_message())
    except SandboxctlError as error:
        _fail(str(error))
    except (typer.Abort, KeyboardInterrupt):
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:  # typer turns Ctrl-C inside a verb into this code
        typer.echo("sandboxctl: interrupted", err=True)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str) -> None:
    print_error(message)
    sys.exit(EXIT_BAD_INPUT)


def print_error(message: str) -> None:
    """``sandboxctl: error: ...`` on stderr, on one line: how every verb reports a
    failure (a ``status --watch`` frame that failed, too)."""
    line = " ".join(message.split())
    typer.echo(f"sandboxctl: error: {line}", err=True)


def _without_httpx_cli() -> None:
    """Keep httpx's own command line out of the process. httpx 0.28 imports its CLI
    (``httpx._main``, with click, rich's progress and syntax, and pygments) whenever
    those are installed, as typer's extras are here: a third of ``status``'s start, for
    a program sandboxctl never runs. With the module blocked, httpx defines a stand-in
    ``main`` that says what to install. Remove this once httpx imports its CLI lazily
    (or the extras are gone). Only before httpx's first import: never a half-loaded one."""
    if "httpx" not in sys.modules:
        sys.modules["httpx._main"] = None  # type: ignore[assignment]  # import stops here
