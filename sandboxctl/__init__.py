"""sandboxctl: run and administer an e2b-compatible sandbox fleet."""

__version__ = "0.1.0"
