"""Where the fleet's inventories come from: one module per backend, one protocol for all."""

from sandboxctl.inventory.source import InventorySource

__all__ = ["InventorySource"]
