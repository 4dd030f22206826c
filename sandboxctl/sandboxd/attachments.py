"""The agent's calls to the node's sandbox network (``network/``): each sandbox's address
on the node's subnet, and attaching, policing and detaching it.

Without a network (``None``: the sandboxes get a network namespace with only ``lo``, or
none at all under the unsafe-process runtime) sandboxes have no address, the calls do
nothing and no egress policy is enforced.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from pathlib import Path

from sandboxctl.core.netpolicy import NetworkPolicy
from sandboxctl.sandboxd.errors import AtCapacity
from sandboxctl.sandboxd.network.sandboxes import Attachment, SandboxNetwork
from sandboxctl.sandboxd.state import SandboxRecord


class Attachments:
    """Thread-safe."""

    def __init__(self, network: SandboxNetwork | None, node: str) -> None:
        self.network = network
        self._node = node
        self._lock = threading.Lock()
        self._addresses: set[str] = set()  # in use or being started

    @property
    def resolv_conf(self) -> Path | None:
        return self.network.resolv_conf if self.network is not None else None

    def take_address(self) -> str:
        """The lowest free sandbox address of the subnet ("" without a network)."""
        if self.network is None:
            return ""
        subnet = self.network.subnet
        with self._lock:
            for index in range(subnet.capacity):
                address = subnet.address(index)
                if address not in self._addresses:
                    self._addresses.add(address)
                    return address
        raise AtCapacity(f"node {self._node}: no free address in {subnet}")

    def use_address(self, address: str) -> None:
        """``address`` is a sandbox's already (an adopted one's, or a started one's)."""
        if address:
            with self._lock:
                self._addresses.add(address)

    def free_address(self, address: str) -> None:
        with self._lock:
            self._addresses.discard(address)

    def start(self, adopted: Iterable[SandboxRecord]) -> None:
        """Re-attach each adopted sandbox's network; drop what others left."""
        if self.network is not None:
            self.network.start([attachment(r) for r in adopted if r.address])

    def stop(self, remove: bool) -> None:
        if self.network is not None:
            self.network.stop(remove=remove)

    def attach(self, record: SandboxRecord, pid: int) -> None:
        if self.network is not None:
            self.network.attach(attachment(record, pid=pid))

    def apply(self, record: SandboxRecord, policy: NetworkPolicy) -> None:
        """Enforce ``policy`` for ``record`` (effective on return)."""
        if self.network is not None:
            self.network.apply(attachment(record, policy))

    def detach(self, record: SandboxRecord) -> None:
        if self.network is not None:
            self.network.detach(record.id, record.address)


def attachment(
    record: SandboxRecord, policy: NetworkPolicy | None = None, pid: int | None = None
) -> Attachment:
    return Attachment(
        record.id,
        record.pid if pid is None else pid,
        record.address,
        record.network if policy is None else policy,
    )
