"""envd, the e2b data plane, served by the host agent for each of its sandboxes.

The agent mounts it under ``/v1/sandboxes/{id}/envd``: the Connect RPCs
``process.Process/*`` and ``filesystem.Filesystem/*`` (JSON codec), plus ``/files`` and
``/health``. Every process and file operation runs *inside* the sandbox (its namespaces
and uid), so no path can reach the host.
"""

ENVD_VERSION = "0.5.7"
