"""``sandboxctl serve``'s one-host development fleet: every part in one process, over one
state directory."""

from sandboxctl.fleet.run import DEFAULT_DOMAIN, Fleet, Ports, run_fleet

__all__ = ["DEFAULT_DOMAIN", "Fleet", "Ports", "run_fleet"]
