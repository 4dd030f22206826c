"""Where the control plane's programs are: ``.tools/bin`` of the checkout (what
``make kube-tools`` builds), or the directory ``$SANDBOXCTL_KUBE_TOOLS`` names; the data
files the build copies from the pinned modules (kwok's stages, Karpenter's CRDs) are in
``share/`` beside it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TOOLS_ENV = "SANDBOXCTL_KUBE_TOOLS"
CHECKOUT_TOOLS = Path(__file__).resolve().parents[3] / ".tools" / "bin"
PROGRAMS = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kwok",
    "karpenter-kwok",
    "helm",
)


class MissingTools(RuntimeError):
    """Some of the control plane's programs are not built; the message says how to get them."""


@dataclass(frozen=True)
class Tools:
    directory: Path

    @classmethod
    def find(cls) -> Tools:
        named = os.environ.get(TOOLS_ENV)
        return cls(Path(named) if named else CHECKOUT_TOOLS)

    def path(self, program: str) -> Path:
        """The program's path; MissingTools (one line) when it is not there."""
        path = self.directory / program
        if not os.access(path, os.X_OK):
            raise MissingTools(
                f"{program} is not in {self.directory}: build the control plane's tools with "
                f"`make kube-tools` (Go and the Go module proxy; see docs/kubernetes.md), or "
                f"name a directory that has them in ${TOOLS_ENV}"
            )
        return path

    def data(self, name: str) -> Path:
        """A data file the build copied from a pinned module (``share/`` beside ``bin/``)."""
        path = self.directory.parent / "share" / name
        if not path.exists():
            raise MissingTools(
                f"{path} is missing: `make kube-tools` copies it from the pinned Go module"
            )
        return path

    def missing(self, programs: tuple[str, ...] = PROGRAMS) -> list[str]:
        return [p for p in programs if not os.access(self.directory / p, os.X_OK)]
