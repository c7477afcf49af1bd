"""Addresses of a run, all in 198.18.0.0/15 (reserved for benchmarking, RFC 2544).

Slot k owns the /29 at 198.18.0.0 + 8k for the host side of DC A and the one at 198.19.0.0 + 8k
for DC B, so parallel
runs never share an address, and the host only ever routes these addresses over the run's own
veth, never through its default gateway.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

A_BLOCK = ipaddress.IPv4Address("198.18.0.0")
B_BLOCK = ipaddress.IPv4Address("198.19.0.0")


@dataclass(frozen=True)
class Addresses:
    host: str  # the host end of the run's veth into DC A
    a: str  # DC A's main host
    a2: str  # DC A's second host, behind the intra-DC path
    b: str  # DC B
    a_block: str  # A side /29, routed over the WAN from B
    cross_a: str  # cross-traffic's endpoint in DC A's namespace a (other tenants' hosts)
    cross_b: str  # and in DC B's

    @classmethod
    def for_slot(cls, slot: int) -> Addresses:
        if not 1 <= slot <= 8191:
            raise ValueError(f"address slot {slot} is outside 1..8191")
        base_a = A_BLOCK + 8 * slot
        base_b = B_BLOCK + 8 * slot
        return cls(
            host=str(base_a + 1),
            a=str(base_a + 2),
            a2=str(base_a + 3),
            b=str(base_b + 2),
            a_block=f"{base_a}/29",
            cross_a=str(base_a + 4),
            cross_b=str(base_b + 3),
        )
