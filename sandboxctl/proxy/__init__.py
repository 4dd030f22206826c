"""The envd proxy: the e2b data plane. It routes each envd request (by the
``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers or the ``{port}-{id}.{domain}`` host) to
the host agent that owns the sandbox, checks the caller's ``X-Access-Token`` against the
claim, and relays the request and its response as streams. See docs/envd-proxy.md.

Modules: ``routing`` (which sandbox and port a request names), ``budget`` (the probe
token bucket), ``app`` (the ASGI app and the relay). Which node owns a sandbox, and its
claim token, the store answers (``store.claims``, one memory shared with the e2b API).
"""

from sandboxctl.proxy.app import ENVD_PORT, create_proxy_app
from sandboxctl.proxy.budget import TokenBucket

__all__ = ["ENVD_PORT", "TokenBucket", "create_proxy_app"]
