"""``python -m sandboxctl_testing.controlplane --workdir DIR --control HOST:PORT [...]``

Runs one :class:`ControlPlane` as a process, for a caller that must not import it (the
lanes' local kit: ``sandboxctl`` never imports ``sandboxctl_testing``). Once the plane is
ready (CRDs Established, the ``--apply`` manifests applied) it writes ``DIR/plane.json``
(the URL, the admin's kubeconfig and certificate files, one kubeconfig per
``--service-account``, the versions of kube-apiserver and etcd) and then answers on the
control address, so that answering there means ready:

- ``GET /healthz``: 200.
- ``GET /plane``: what ``plane.json`` holds.
- ``POST /kube-apiserver/stop``, ``POST /etcd/stop``: stop that part and answer once it has
  exited; by SIGKILL, as the plane's own outages do (a SIGTERMed kube-apiserver stops
  listening at once but exits only once its open watches end, 20 s later), or by the
  signal ``?signal=TERM`` (or ``INT``) names.
- ``POST /kube-apiserver/start``, ``POST /etcd/start``: start it again (when it is not
  running) on the same ports and data and answer once kube-apiserver is ready again
  (after etcd's start too: a caller wants the API back, not only its store).

``--check-tools`` only checks that etcd and kube-apiserver are built: exit 0, or exit 3
with the one line that says how to build them.

A failed start is one line on stderr and exit 2; SIGTERM or SIGINT stops every part.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import yaml

from sandboxctl_testing.controlplane.plane import READY_TIMEOUT, ControlPlane, server_side_apply
from sandboxctl_testing.controlplane.tools import MissingTools, Tools

PLANE_FILE = "plane.json"
ACCOUNT_PREFIX = "account-"  # --service-account NAME's kubeconfig: DIR/account-NAME.kubeconfig
MISSING_TOOLS = 3  # --check-tools' exit status when a program is not built
PARTS = ("kube-apiserver", "etcd")
SIGNALS = {"TERM": signal.SIGTERM, "KILL": signal.SIGKILL, "INT": signal.SIGINT}
MANAGER = "sandboxctl-controlplane"  # the field manager of what --apply applies
RBAC = "/apis/rbac.authorization.k8s.io/v1"
# Where server-side apply puts each kind --apply knows: (path prefix, namespaced).
KINDS: dict[str, tuple[str, bool]] = {
    "Namespace": ("/api/v1/namespaces", False),
    "ServiceAccount": ("/api/v1/serviceaccounts", True),
    "ClusterRole": (f"{RBAC}/clusterroles", False),
    "ClusterRoleBinding": (f"{RBAC}/clusterrolebindings", False),
    "Role": (f"{RBAC}/roles", True),
    "RoleBinding": (f"{RBAC}/rolebindings", True),
}


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check_tools:
        return check_tools()
    if args.workdir is None or args.control is None:
        print("controlplane: error: --workdir and --control are required", file=sys.stderr)  # noqa: T201
        return 2
    host, _, port = args.control.rpartition(":")
    try:
        plane = ControlPlane(args.workdir, host=args.host, crds=args.crds)
    except MissingTools as error:
        print(f"controlplane: error: {error}", file=sys.stderr)  # noqa: T201
        return 2
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        plane.start()
        for manifest in args.apply:
            apply_manifest(plane, manifest, args.namespace)
        facts = describe(plane, service_accounts(plane, args.service_account))
        (args.workdir / PLANE_FILE).write_text(json.dumps(facts, indent=2) + "\n")
        server = ThreadingHTTPServer((host, int(port)), _handler(plane, facts))
    except Exception as error:
        print(f"controlplane: error: {' '.join(str(error).split())}", file=sys.stderr)  # noqa: T201
        _quietly(plane.stop)
        return 2
    threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
    print(f"controlplane: {facts['name']} at {plane.url}, control on {args.control}", flush=True)  # noqa: T201
    while not stopping.wait(1.0):  # a timed wait: the signal handler runs between waits
        pass
    server.shutdown()
    plane.stop()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandboxctl_testing.controlplane",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--check-tools",
        action="store_true",
        help=f"exit 0 if {' and '.join(PARTS)} are built; else say how to build them, exit 3",
    )
    parser.add_argument("--workdir", type=Path, help="state, certificates, logs")
    parser.add_argument("--host", default="127.0.0.1", help="the address kube-apiserver listens on")
    parser.add_argument("--control", help="HOST:PORT of the control endpoint")
    parser.add_argument(
        "--crds", type=Path, action="append", default=[], help="apply the CRDs in this directory"
    )
    parser.add_argument(
        "--apply",
        type=Path,
        action="append",
        default=[],
        help=f"apply this file's objects (kinds: {', '.join(KINDS)}), in the order given",
    )
    parser.add_argument(
        "--namespace", default="default", help="for --apply's namespaced objects that name none"
    )
    parser.add_argument(
        "--service-account",
        action="append",
        default=[],
        metavar="NAME=NAMESPACE/ACCOUNT",
        help="write account-NAME.kubeconfig for a client certificate that authenticates as that "
        "service account (its user and groups), which RBAC then judges",
    )
    return parser


def check_tools() -> int:
    """Whether this process could start a plane: the programs it runs are built."""
    tools = Tools.find()
    try:
        for program in PARTS:
            tools.path(program)
    except MissingTools as error:
        print(error)  # noqa: T201
        return MISSING_TOOLS
    return 0


def service_accounts(plane: ControlPlane, specs: list[str]) -> dict[str, str]:
    """One kubeconfig per ``NAME=NAMESPACE/ACCOUNT``: the user and groups a service
    account's token carries, in a client certificate instead."""
    made = {}
    for spec in specs:
        name, _, account = spec.partition("=")
        namespace, _, account_name = account.partition("/")
        if not (name and namespace and account_name):
            raise ValueError(f"--service-account {spec!r}: expected NAME=NAMESPACE/ACCOUNT")
        user = f"system:serviceaccount:{namespace}:{account_name}"
        groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}"]
        # Prefixed: the plane keeps its own certificates (apiserver, admin, ...) by name.
        made[name] = str(plane.kubeconfig_for(user, groups, name=f"{ACCOUNT_PREFIX}{name}"))
    return made


def apply_manifest(plane: ControlPlane, path: Path, namespace: str) -> None:
    """Server-side apply every object of ``path`` (of the kinds in :data:`KINDS`)."""
    with plane.http() as http:
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not isinstance(document, dict):
                continue
            kind, name = document.get("kind", ""), document["metadata"]["name"]
            if kind not in KINDS:
                raise ValueError(f"{path}: cannot apply a {kind or 'document without kind'}")
            prefix, namespaced = KINDS[kind]
            if namespaced:
                document["metadata"].setdefault("namespace", namespace)
                owner = document["metadata"]["namespace"]
                group, _, plural = prefix.rpartition("/")
                prefix = f"{group}/namespaces/{owner}/{plural}"
            server_side_apply(http, f"{prefix}/{name}", document, MANAGER)


def describe(plane: ControlPlane, kubeconfigs: dict[str, str]) -> dict[str, Any]:
    versions = versions_of(plane)
    return {
        "name": f"kube-apiserver {versions['kube-apiserver']} + etcd {versions['etcd']}",
        "url": plane.url,
        "ca": str(plane.ca.cert),
        "admin": {
            "kubeconfig": str(plane.kubeconfig),
            "cert": str(plane.admin_pair.cert),
            "key": str(plane.admin_pair.key),
        },
        "kubeconfigs": kubeconfigs,
        "versions": versions,
        "logs": str(plane.logs),
    }


def versions_of(plane: ControlPlane) -> dict[str, str]:
    """What the running programs report: kube-apiserver's gitVersion, etcd's server."""
    with plane.http() as http:
        apiserver = str(http.get("/version").json().get("gitVersion", "?"))
    etcd = str(httpx.get(f"{plane.etcd_url}/version", timeout=5).json().get("etcdserver", "?"))
    return {"kube-apiserver": apiserver, "etcd": etcd}


def _handler(plane: ControlPlane, facts: dict[str, Any]) -> type[BaseHTTPRequestHandler]:
    lock = threading.Lock()  # one outage action at a time

    def stop(part: str, sig: int | None) -> None:
        action = plane.stop_apiserver if part == "kube-apiserver" else plane.stop_etcd
        if sig is None:
            action()  # the plane's own outage signal
        else:
            action(sig)

    def start(part: str) -> None:
        # Starting a running part only waits for it (a caller may heal what is up).
        if part == "etcd":
            if not plane.etcd.running:
                plane.start_etcd()
        elif not plane.apiserver.running:
            plane.start_apiserver()
        if plane.apiserver.running:  # the API is back, not only its store
            plane.apiserver.ready(READY_TIMEOUT)

    class Control(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if path == "/healthz":
                self._answer(HTTPStatus.OK, "ok\n")
            elif path == "/plane":
                self._answer(HTTPStatus.OK, json.dumps(facts) + "\n")
            else:
                self._answer(HTTPStatus.NOT_FOUND, f"no {path}\n")

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            part, _, verb = url.path.strip("/").partition("/")
            wanted = parse_qs(url.query).get("signal", [""])[0].upper()
            if part not in PARTS or verb not in ("stop", "start") or wanted not in ("", *SIGNALS):
                self._answer(HTTPStatus.NOT_FOUND, f"no {url.path} (signal {wanted})\n")
                return
            sig = SIGNALS.get(wanted)
            action: Callable[[], None] = (
                (lambda: stop(part, sig)) if verb == "stop" else (lambda: start(part))
            )
            with lock:
                try:
                    action()
                except Exception as error:
                    text = " ".join(str(error).split())
                    self._answer(HTTPStatus.INTERNAL_SERVER_ERROR, f"{part} {verb}: {text}\n")
                    return
            self._answer(HTTPStatus.OK, f"{part} {verb}: done\n")

        def _answer(self, status: HTTPStatus, text: str) -> None:
            body = text.encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            print(f"controlplane: {format % args}", flush=True)  # noqa: T201

    return Control


def _quietly(action: Callable[[], None]) -> None:
    try:
        action()
    except Exception as error:
        print(f"controlplane: stopping: {error}", file=sys.stderr)  # noqa: T201


if __name__ == "__main__":
    sys.exit(main())
