"""The ``sandboxctl`` entry point: every verb, one-line errors, stable exit codes.

Exit codes: 0 success; 2 bad input (a flag, a file, unsafe settings); 3 a check failed
(``inventory --fail-on-stale``); 130 interrupted.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from sandboxctl import __version__
from sandboxctl.cli import (
    apiserver,
    guard,
    inventory,
    proxy,
    publish,
    sandboxd,
    serve,
    simulate,
    template,
)
from sandboxctl.core.errors import SandboxctlError

EXIT_BAD_INPUT = 2

app = typer.Typer(
    name="sandboxctl",
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


app.command("inventory")(inventory.inventory)
app.command("simulate")(simulate.simulate)
app.command("serve-sandboxd")(sandboxd.serve_sandboxd)
app.command("serve-apiserver")(apiserver.serve_apiserver)
app.command("serve-proxy")(proxy.serve_proxy)
app.command("serve")(serve.serve)
app.command("publish")(publish.publish)
app.add_typer(template.app)
app.add_typer(guard.app, name="guard-workers")


def main(argv: list[str] | None = None) -> None:
    """Run the app; user errors become one line on stderr and a non-zero exit, never a trace."""
    try:
        code = app(args=argv, prog_name="sandboxctl", standalone_mode=False)
    except typer.TyperException as error:
        _fail(error.format_message())
    except SandboxctlError as error:
        _fail(str(error))
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("sandboxctl: interrupted", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str) -> None:
    line = " ".join(message.split())
    typer.echo(f"sandboxctl: error: {line}", err=True)
    sys.exit(EXIT_BAD_INPUT)
