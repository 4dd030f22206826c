"""The e2b-compatible control-plane API (what the unmodified e2b SDK calls) over the
sandbox store.

Modules: ``app`` (the FastAPI app and its endpoints), ``config`` (E2bConfig and the key
and alias files), ``models`` (the response bodies), ``paging`` (list filters, cursor and
the sorted index a page is read from), ``ids`` (sandbox id spellings), ``auth`` (keys).
"""

from sandboxctl.apiserver.e2b.app import create_e2b_app
from sandboxctl.apiserver.e2b.config import (
    DEFAULT_ALIASES,
    DEFAULT_ENVD_VERSION,
    DEFAULT_TIMEOUT,
    E2bConfig,
    load_api_keys,
    load_template_aliases,
)

__all__ = [
    "DEFAULT_ALIASES",
    "DEFAULT_ENVD_VERSION",
    "DEFAULT_TIMEOUT",
    "E2bConfig",
    "create_e2b_app",
    "load_api_keys",
    "load_template_aliases",
]
