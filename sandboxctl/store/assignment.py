"""A granted claim, as the store answers it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sandboxctl.core.snapshot import Located


@dataclass(frozen=True, slots=True)
class Assignment:
    """The token stays inside the server; callers derive from it. ``located`` is the new
    sandbox as this server reads it from now on."""

    claim_id: str
    node: str
    address: str
    token: str
    deadline: datetime | None
    located: Located
