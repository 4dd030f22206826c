"""``sandboxctl serve-apiserver``: the Kubernetes-style Sandbox API over the fleet, and
beside it the e2b-compatible API when e2b keys (or anonymous mode) are configured."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

import typer

from sandboxctl.apiserver.auth import first_token, load_kube_tokens
from sandboxctl.apiserver.e2b import (
    DEFAULT_ALIASES,
    DEFAULT_ENVD_VERSION,
    DEFAULT_TIMEOUT,
    E2bConfig,
    create_e2b_app,
    load_api_keys,
    load_template_aliases,
)
from sandboxctl.apiserver.kube import create_kube_app
from sandboxctl.apiserver.kubeconfig import server_url, write_kubeconfig
from sandboxctl.cli.addresses import parse_listen
from sandboxctl.cli.aggregation import (
    CACHE_TTL,
    FRONT_PROXY,
    AuthorizationCacheTtl,
    RequestHeaderAllowedNames,
    RequestHeaderCaFile,
    aggregation,
)
from sandboxctl.cli.options import (
    BODY_IDLE_TIMEOUT,
    HEAD_TIMEOUT,
    KubeTokenFile,
    MaxConnections,
    PublishInterval,
    Reference,
    RequestBodyIdleTimeout,
    RequestHeadTimeout,
    StaleAfter,
    TlsCertFile,
    TlsKeyFile,
    freshness_rule,
    read_bounds,
    service_logging,
)
from sandboxctl.cli.running import run_until_stopped
from sandboxctl.cli.sources import (
    DEFAULT_POLL_INTERVAL,
    InventoryPoll,
    Kubeconfig,
    KubeSource,
    SandboxdTokenFile,
    Seeds,
    Source,
    fleet_source,
)
from sandboxctl.cli.warmpools import (
    LeaderElectionNamespace,
    LeaseDuration,
    RenewDeadline,
    RetryPeriod,
    WarmPoolDriverFlag,
    WarmPoolSyncInterval,
    check_warm_pool_driver,
    warm_pool_manager,
    warm_pool_settings,
)
from sandboxctl.core.errors import ConfigurationError
from sandboxctl.core.freshness import DEFAULT_PUBLISH_INTERVAL, DEFAULT_STALE_AFTER, ReferenceMode
from sandboxctl.core.leases import (
    LEASE_DURATION,
    RENEW_DEADLINE,
    RETRY_PERIOD,
    WARM_POOL_SYNC_INTERVAL,
)
from sandboxctl.lifecycle import Group
from sandboxctl.secretfiles import read_secret
from sandboxctl.serving import bind, tls_files
from sandboxctl.serving.bounds import DEFAULT_MAX_CONNECTIONS
from sandboxctl.serving.metrics import MetricsListener


def serve_apiserver(
    source: Source = "mesh",
    seeds: Seeds = "",
    token_file: SandboxdTokenFile = None,
    kubeconfig: Kubeconfig = None,
    inventory_poll: InventoryPoll = DEFAULT_POLL_INTERVAL,
    stale_after: StaleAfter = DEFAULT_STALE_AFTER,
    reference: Reference = ReferenceMode.PUBLISH,
    publish_interval: PublishInterval = DEFAULT_PUBLISH_INTERVAL,
    listen: Annotated[
        str, typer.Option("--listen", metavar="HOST:PORT", help="Address to serve the API on.")
    ] = "127.0.0.1:3002",
    metrics_listen: Annotated[
        str,
        typer.Option(
            "--metrics-listen",
            metavar="HOST:PORT",
            help="Serve /metrics (request latency of the Sandbox API and the e2b API) on "
            "this listener of its own, plain HTTP without a token: keep it on loopback or "
            "a private network. Default: not served.",
        ),
    ] = "",
    kubeconfig_out: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig-out",
            metavar="FILE",
            help="Write a kubeconfig for this server here (mode 0600), for kubectl --kubeconfig: "
            "it holds the first token of --kube-token-file.",
        ),
    ] = None,
    kube_token_file: KubeTokenFile = None,
    tls_cert_file: TlsCertFile = None,
    tls_key_file: TlsKeyFile = None,
    e2b_listen: Annotated[
        str,
        typer.Option(
            "--e2b-listen",
            metavar="HOST:PORT",
            help="Address to serve the e2b API on (served only with --e2b-api-key-file "
            "or --e2b-allow-anonymous).",
        ),
    ] = "127.0.0.1:3000",
    e2b_key_file: Annotated[
        Path | None,
        typer.Option(
            "--e2b-api-key-file",
            metavar="FILE",
            help="e2b API keys, one per line: 'key' or 'key namespace'. Enables the e2b API.",
        ),
    ] = None,
    e2b_anonymous: Annotated[
        bool,
        typer.Option(
            "--e2b-allow-anonymous",
            help="Serve the e2b API without key checks, in --e2b-namespace. Enables it.",
        ),
    ] = False,
    e2b_domain: Annotated[
        str,
        typer.Option(
            "--e2b-domain",
            metavar="DOMAIN",
            help="The domain e2b clients build envd hosts from (required with the e2b API).",
        ),
    ] = "",
    e2b_secret_file: Annotated[
        Path | None,
        typer.Option(
            "--e2b-envd-secret-file",
            metavar="FILE",
            help="Secret keying envdAccessToken = HMAC-SHA256(secret, claim token) "
            "(required with the e2b API).",
        ),
    ] = None,
    e2b_namespace: Annotated[
        str,
        typer.Option(
            "--e2b-namespace", help="Namespace of keys given without one, and of anonymous use."
        ),
    ] = "default",
    e2b_default_timeout: Annotated[
        int,
        typer.Option(
            "--e2b-default-timeout",
            metavar="SECONDS",
            help="Lease of a sandbox created or connected without a timeout.",
        ),
    ] = DEFAULT_TIMEOUT,
    e2b_envd_version: Annotated[
        str, typer.Option("--e2b-envd-version", help="envdVersion reported to e2b clients.")
    ] = DEFAULT_ENVD_VERSION,
    e2b_alias_file: Annotated[
        Path | None,
        typer.Option(
            "--e2b-template-alias-file",
            metavar="FILE",
            help="Template aliases, one per line: 'alias template [small|medium|large]' "
            "(default: base and code-interpreter-v1 -> base small).",
        ),
    ] = None,
    warm_pool_driver: WarmPoolDriverFlag = None,
    warm_pool_sync_interval: WarmPoolSyncInterval = WARM_POOL_SYNC_INTERVAL,
    leader_election_namespace: LeaderElectionNamespace = "",
    leader_election_lease_duration: LeaseDuration = LEASE_DURATION,
    leader_election_renew_deadline: RenewDeadline = RENEW_DEADLINE,
    leader_election_retry_period: RetryPeriod = RETRY_PERIOD,
    requestheader_client_ca_file: RequestHeaderCaFile = None,
    requestheader_allowed_names: RequestHeaderAllowedNames = FRONT_PROXY,
    authorization_cache_ttl: AuthorizationCacheTtl = CACHE_TTL,
    request_head_timeout: RequestHeadTimeout = HEAD_TIMEOUT,
    request_body_idle_timeout: RequestBodyIdleTimeout = BODY_IDLE_TIMEOUT,
    max_connections: MaxConnections = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Serve sandboxes.agents.x-k8s.io/v1beta1 (list, get, watch, create, delete) for kubectl,
    and the e2b API when configured."""
    log = service_logging("sandboxctl.apiserver")
    host, port = parse_listen("--listen", listen)
    bounds = read_bounds(request_head_timeout, request_body_idle_timeout, max_connections)
    rule = freshness_rule(stale_after, reference, publish_interval, log=log)
    e2b_config = e2b_settings(
        e2b_key_file,
        e2b_anonymous,
        e2b_domain,
        e2b_secret_file,
        e2b_namespace,
        e2b_default_timeout,
        e2b_envd_version,
        e2b_alias_file,
    )
    e2b_address = parse_listen("--e2b-listen", e2b_listen) if e2b_config else None
    metrics = metrics_listener(metrics_listen)
    mesh = fleet_source(
        source, seeds, token_file, inventory_poll, kubeconfig, publish_interval, log
    )
    check_warm_pool_driver(mesh, warm_pool_driver, warm_pool_sync_interval)
    tls = tls_files(tls_cert_file, tls_key_file)
    delegated = aggregation(
        requestheader_client_ca_file, requestheader_allowed_names, authorization_cache_ttl,
        tls, mesh,
    )  # fmt: skip
    if kube_token_file is None and delegated is None:
        raise ConfigurationError(
            "serve-apiserver needs --kube-token-file: the Sandbox API serves only the "
            "holders of a token (one per line: 'token namespace...', '*' for every namespace)"
        )
    if kubeconfig_out is not None and kube_token_file is None:
        raise ConfigurationError("--kubeconfig-out needs --kube-token-file (its first token)")
    tokens = load_kube_tokens(kube_token_file) if kube_token_file is not None else None
    if delegated is not None and tls is not None:
        tls = delegated.serving(tls)
    with contextlib.ExitStack() as running:
        sock = running.enter_context(bind(host, port))  # a taken port fails first
        port = sock.getsockname()[1]  # --listen HOST:0 picked one
        e2b_sock = running.enter_context(bind(*e2b_address)) if e2b_address else None
        times = metrics.bind(running)
        store = running.enter_context(mesh.store(rule))
        driver = warm_pool_settings(
            warm_pool_sync_interval, leader_election_namespace, leader_election_lease_duration,
            leader_election_renew_deadline, leader_election_retry_period,
        )  # fmt: skip
        manager = warm_pool_manager(mesh, store, warm_pool_driver, driver, log)
        url = server_url(host, port, tls=tls is not None)
        if kubeconfig_out is not None:
            ca = tls.cert_file.read_bytes() if tls is not None else None
            assert kube_token_file is not None  # checked before anything started
            write_kubeconfig(kubeconfig_out, url, first_token(kube_token_file), ca)
            log.info("wrote a kubeconfig for kubectl to %s", kubeconfig_out)
            if tls is None:
                log.warning(
                    "kubectl sends a kubeconfig's token over HTTPS only: serve with "
                    "--tls-cert-file and --tls-private-key-file for kubectl to authenticate"
                )
        log.info(
            "serving the Sandbox API on %s over %s (%d tokens)",
            url,
            mesh.description,
            len(tokens) if tokens is not None else 0,
        )
        front = None
        if delegated is not None and isinstance(mesh, KubeSource):
            front = functools.partial(delegated.wrap, source=mesh)
            log.info("aggregated mode: requestheader authentication, SubjectAccessReview")
        # Open watches end as soon as the stop begins, so a stop signal is not held up for
        # as long as a watch may last (kubectl asks for 5 to 10 min).
        app = create_kube_app(
            store,
            None if delegated else tokens,
            stopping=manager.stopping.is_set,
            aliases=template_aliases(e2b_config),
            times=times,
            front=front,
        )
        listeners = [(app, sock)]
        if e2b_config is not None and e2b_sock is not None:
            e2b_host, e2b_port = e2b_sock.getsockname()[:2]
            log.info("serving the e2b API on %s", server_url(e2b_host, e2b_port, tls is not None))
            listeners.append((create_e2b_app(store, e2b_config, times), e2b_sock))
        manager.add(metrics.served(listeners, tls, bounds, log=log), Group.SERVERS)
        run_until_stopped(manager)


def metrics_listener(text: str) -> MetricsListener:
    """``--metrics-listen``'s listener, its address checked before anything binds."""
    return MetricsListener(parse_listen("--metrics-listen", text) if text else None)


def template_aliases(e2b_config: E2bConfig | None) -> Mapping[str, tuple[str, str]]:
    """The aliases a Sandbox's image is read through: the e2b API's, so both APIs read a
    template name alike (the defaults when the e2b API is off)."""
    return e2b_config.aliases if e2b_config is not None else DEFAULT_ALIASES


def e2b_settings(
    key_file: Path | None,
    anonymous: bool,
    domain: str,
    secret_file: Path | None,
    namespace: str,
    default_timeout: int,
    envd_version: str,
    alias_file: Path | None,
) -> E2bConfig | None:
    """The e2b API's config, or None when it is not enabled (neither keys nor anonymous).
    Enabled without a domain or an envd secret is a one-line startup error naming the flag."""
    if key_file is None and not anonymous:
        return None
    if not domain:
        raise ConfigurationError(
            "the e2b API (--e2b-api-key-file/--e2b-allow-anonymous) needs --e2b-domain"
        )
    if secret_file is None:
        raise ConfigurationError(
            "the e2b API (--e2b-api-key-file/--e2b-allow-anonymous) needs --e2b-envd-secret-file"
        )
    if default_timeout <= 0:
        raise ConfigurationError("--e2b-default-timeout must be a positive number of seconds")
    keys = load_api_keys(key_file, namespace) if key_file is not None else {}
    if key_file is not None and not keys and not anonymous:
        raise ConfigurationError(f"--e2b-api-key-file {key_file}: no keys in the file")
    secret = read_secret("--e2b-envd-secret-file", secret_file).encode()
    aliases = load_template_aliases(alias_file) if alias_file is not None else dict(DEFAULT_ALIASES)
    return E2bConfig(
        domain=domain,
        envd_secret=secret,
        api_keys=keys,
        allow_anonymous=anonymous,
        namespace=namespace,
        default_timeout=default_timeout,
        envd_version=envd_version,
        aliases=aliases,
    )
