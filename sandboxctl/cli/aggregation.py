"""``serve-apiserver`` behind kube-apiserver's aggregation layer: the requestheader and
SubjectAccessReview flags, and the app they wrap."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from sandboxctl.cli.options import parse_duration_flag
from sandboxctl.cli.sources import KubeSource, MeshSource
from sandboxctl.core.durations import format_duration
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.serving import Tls

CACHE_TTL = timedelta(seconds=10)  # sandboxctl.apiserver.delegated.CACHE_TTL
FRONT_PROXY = "front-proxy-client"

RequestHeaderCaFile = Annotated[
    Path | None,
    typer.Option(
        "--requestheader-client-ca-file",
        metavar="FILE",
        help="Serve behind kube-apiserver's aggregation layer: believe the user in "
        "X-Remote-User/X-Remote-Group only from a client certificate this CA signed, and "
        "authorize each request with a SubjectAccessReview. Needs TLS and --source kube.",
    ),
]
RequestHeaderAllowedNames = Annotated[
    str,
    typer.Option(
        "--requestheader-allowed-names",
        metavar="CN,...",
        help="Common names the front proxy's certificate may have ('' for any the CA signed).",
    ),
]
AuthorizationCacheTtl = Annotated[
    timedelta,
    typer.Option(
        "--authorization-cache-ttl",
        parser=parse_duration_flag,
        metavar="DURATION",
        help="How long a SubjectAccessReview's answer is reused.",
        show_default=format_duration(CACHE_TTL),
    ),
]


@dataclass(frozen=True, slots=True)
class Aggregation:
    client_ca: Path
    allowed_names: frozenset[str]
    cache_ttl: timedelta

    def serving(self, tls: Tls) -> Tls:
        return dataclasses.replace(tls, client_ca=self.client_ca)

    def wrap(self, app: Any, source: KubeSource) -> Any:
        """The app behind requestheader authentication and SubjectAccessReview."""
        from sandboxctl.apiserver.delegated import AccessReviewer, Delegated, RequestHeaderConfig

        reviewer = AccessReviewer(source.api, self.cache_ttl)
        return Delegated(app, reviewer, RequestHeaderConfig(self.allowed_names))


def aggregation(
    client_ca: Path | None,
    allowed_names: str,
    cache_ttl: timedelta,
    tls: Tls | None,
    source: MeshSource | KubeSource,
) -> Aggregation | None:
    """The aggregation settings, or None without ``--requestheader-client-ca-file``;
    one line and exit 2 for a setting that cannot work."""
    if client_ca is None:
        return None
    flag = "--requestheader-client-ca-file"
    if not client_ca.is_file():
        raise ConfigurationError(f"{flag} {client_ca}: no such file")
    if tls is None:
        raise ConfigurationError(f"{flag} needs --tls-cert-file and --tls-private-key-file")
    if not isinstance(source, KubeSource):
        raise ConfigurationError(f"{flag} needs --source kube (reviews go to its API server)")
    if cache_ttl < timedelta(0):
        raise ConfigurationError("--authorization-cache-ttl must not be negative")
    names = frozenset(n.strip() for n in allowed_names.split(",") if n.strip())
    return Aggregation(client_ca, names, cache_ttl)
