"""Every sandbox's network: a veth to the host, NAT out, and a host-side filter.

See docs/network.md for the topology and the rules in order.
"""
