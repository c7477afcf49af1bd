"""IPv4 packets for the queue-discipline tests: a valid header (with checksum), ports, DSCP
and ECN where asked, padded to the size wanted."""

from __future__ import annotations

import struct

TCP, UDP, ICMP = 6, 17, 1
AF11, AF21, EF = 10, 18, 46


def header_checksum(header: bytes) -> int:
    total = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ip_packet(
    size: int = 1500,
    src: str = "198.18.0.10",
    dst: str = "198.19.0.10",
    protocol: int = TCP,
    sport: int = 1000,
    dport: int = 2000,
    dscp: int = 0,
    ecn: int = 0,
) -> bytes:
    tos = (dscp << 2) | ecn
    source = bytes(int(x) for x in src.split("."))
    destination = bytes(int(x) for x in dst.split("."))
    header = struct.pack(
        "!BBHHHBBH4s4s", 0x45, tos, size, 0, 0, 64, protocol, 0, source, destination
    )
    header = header[:10] + struct.pack("!H", header_checksum(header)) + header[12:]
    ports = struct.pack("!HH", sport, dport) if protocol in (TCP, UDP) else b"\0\0\0\0"
    return header + ports + b"\0" * (size - len(header) - len(ports))


def flow(port: int, size: int = 1500, **fields) -> bytes:
    """A TCP packet of the flow identified by its source port."""
    return ip_packet(size, sport=port, **fields)
