"""The host agent: runs isolated sandboxes with warm pools and leases, behind an HTTP API."""
