"""An ``ApiClient`` from a kubeconfig file, or from the pod's service account."""

from __future__ import annotations

import os
from pathlib import Path

from kubernetes import client, config

from sandboxctl.kube.errors import KubeConfigError

IN_CLUSTER_ENV = "KUBERNETES_SERVICE_HOST"
POOL_SIZE = 32  # informers, the driver's writes and lease renewals share the client


def api_client(kubeconfig: Path | None = None, context: str | None = None) -> client.ApiClient:
    """The client for ``kubeconfig``; without one, the pod's service account when running
    in a pod, else ``$KUBECONFIG`` or ``~/.kube/config``. KubeConfigError (one line) when
    none of them can be read."""
    configuration = client.Configuration()
    try:
        if kubeconfig is not None:
            if not kubeconfig.is_file():
                raise KubeConfigError(f"--kubeconfig {kubeconfig}: no such file")
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(kubeconfig),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        elif os.environ.get(IN_CLUSTER_ENV):
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            default = Path(os.environ.get("KUBECONFIG", "~/.kube/config")).expanduser()
            if not default.is_file():
                raise KubeConfigError(
                    "no kubeconfig: pass --kubeconfig FILE, set KUBECONFIG, or run in a pod"
                )
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=str(default),
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
    except config.ConfigException as error:
        where = f"--kubeconfig {kubeconfig}" if kubeconfig is not None else "kubeconfig"
        raise KubeConfigError(f"{where}: {' '.join(str(error).split())}") from None
    configuration.connection_pool_maxsize = POOL_SIZE
    return client.ApiClient(configuration)
