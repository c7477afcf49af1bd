"""Two datacenters in network namespaces joined by a shaped WAN link."""
