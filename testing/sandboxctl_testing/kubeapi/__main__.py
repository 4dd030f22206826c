"""``python -m sandboxctl_testing.kubeapi --port N [--state FILE] [--crds DIR] ...``

Prints one line, ``kubeapi: serving on http://HOST:PORT``, once it answers; SIGTERM or
SIGINT stops it after writing the state file.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from sandboxctl_testing.kubeapi.runner import REPO_CRDS, start
from sandboxctl_testing.kubeapi.store import DEFAULT_HISTORY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandboxctl_testing.kubeapi", description=__doc__
    )
    parser.add_argument(
        "--port", type=int, required=True, help="port to listen on (0: any free one)"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--state", type=Path, help="keep objects in this file across restarts")
    parser.add_argument(
        "--crds",
        type=Path,
        action="append",
        help=f"register the CRDs in this directory's YAML files (default: {REPO_CRDS}, "
        "when it exists)",
    )
    parser.add_argument(
        "--token-file", type=Path, help='static tokens: token,user,uid,"group1,group2"'
    )
    parser.add_argument(
        "--bookmark-interval", type=float, default=1.0, help="seconds between watch bookmarks"
    )
    parser.add_argument(
        "--history", type=int, default=DEFAULT_HISTORY, help="events kept for watches"
    )
    parser.add_argument("--request-log", type=Path, help="append one JSON line per request here")
    args = parser.parse_args(argv)
    crds = args.crds if args.crds is not None else ([REPO_CRDS] if REPO_CRDS.is_dir() else [])
    try:
        running = start(
            args.port,
            host=args.host,
            state=args.state,
            crds=crds,
            token_file=args.token_file,
            bookmark_seconds=args.bookmark_interval,
            history=args.history,
            request_log=args.request_log,
        )
    except (OSError, ValueError) as error:
        print(f"kubeapi: error: {error}", file=sys.stderr)  # noqa: T201
        return 2
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    print(f"kubeapi: serving on {running.url}", flush=True)  # noqa: T201 (the ready line)
    while not stopping.wait(0.5):
        pass
    running.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
