"""What the queueing disciplines read from an IPv4 packet: its flow, its DSCP class, its ECN
field; and the one change they make to it (marking congestion, as fq_codel does with ECN).

The shaper sees raw IP packets (TUN without packet information); anything that is not IPv4
(there is no IPv6 on the emulator's links) is one anonymous flow of best effort.
"""

from __future__ import annotations

FlowKey = tuple[int, bytes, bytes, int, int]  # protocol, source, destination, ports

TCP = 6
TCP_PSH = 0x08
TCP_FIN_OR_RST = 0x01 | 0x04
UDP = 17
ECN_MASK = 0x03
ECN_NOT_ECT = 0x00
ECN_CE = 0x03
_OTHER_FLOW: FlowKey = (0, b"", b"", 0, 0)


def _is_ipv4(packet: bytes) -> bool:
    return len(packet) >= 20 and packet[0] >> 4 == 4


def flow_key(packet: bytes) -> FlowKey:
    """The 5-tuple (protocol, addresses, ports; ports are 0 for other protocols and for
    fragments after the first), which Linux's fq and fq_codel hash into flows."""
    if len(packet) < 20 or packet[0] >> 4 != 4:  # _is_ipv4, inlined: once a packet
        return _OTHER_FLOW
    protocol = packet[9]
    header = (packet[0] & 0x0F) * 4
    first_fragment = (packet[6] & 0x1F) == 0 and packet[7] == 0
    if protocol in (TCP, UDP) and first_fragment and len(packet) >= header + 4:
        source_port = (packet[header] << 8) | packet[header + 1]
        destination_port = (packet[header + 2] << 8) | packet[header + 3]
    else:
        source_port = destination_port = 0
    return protocol, packet[12:16], packet[16:20], source_port, destination_port


def dscp(packet: bytes) -> int:
    """The DSCP field (the upper six bits of the former TOS byte); 0 when not IPv4."""
    return packet[1] >> 2 if _is_ipv4(packet) else 0


def ends_a_tcp_write(packet: bytes) -> bool:
    """Whether the packet is an IPv4 TCP segment with data and PSH set: the last segment of a
    write the sender's kernel pushed (not a bare ACK, SYN or FIN, nor a write's first part)."""
    if not _is_ipv4(packet) or packet[9] != TCP:
        return False
    header = (packet[0] & 0x0F) * 4
    if len(packet) < header + 14 or not packet[header + 13] & TCP_PSH:
        return False
    total = (packet[2] << 8) | packet[3]
    return total > header + (packet[header + 12] >> 4) * 4


def ends_a_tcp_connection(packet: bytes) -> bool:
    """Whether the packet is an IPv4 TCP segment with FIN or RST set: its sender will send no
    more on the connection (RST: neither side will)."""
    if not _is_ipv4(packet) or packet[9] != TCP:
        return False
    flags = (packet[0] & 0x0F) * 4 + 13
    return len(packet) > flags and bool(packet[flags] & TCP_FIN_OR_RST)


def tcp_ends(packet: bytes) -> tuple[bytes, int, bytes, int]:
    """An IPv4 TCP segment's source address and port, destination address and port."""
    header = (packet[0] & 0x0F) * 4
    return (
        packet[12:16],
        int.from_bytes(packet[header : header + 2], "big"),
        packet[16:20],
        int.from_bytes(packet[header + 2 : header + 4], "big"),
    )


def ecn_capable(packet: bytes) -> bool:
    """Whether the sender declared the packet ECN-capable (ECT(0), ECT(1), or already CE)."""
    return _is_ipv4(packet) and (packet[1] & ECN_MASK) != ECN_NOT_ECT


def mark_congestion(packet: bytes) -> bytes:
    """The packet with its ECN field set to CE and the header checksum updated (RFC 1624)."""
    tos = packet[1]
    marked = tos | ECN_CE
    if marked == tos:
        return packet
    # The checksum covers 16-bit words; the TOS byte is the low half of the first word.
    old_word = (packet[0] << 8) | tos
    new_word = (packet[0] << 8) | marked
    checksum = (packet[10] << 8) | packet[11]
    total = (~checksum & 0xFFFF) + (~old_word & 0xFFFF) + new_word
    total = (total & 0xFFFF) + (total >> 16)
    total = (total & 0xFFFF) + (total >> 16)
    checksum = ~total & 0xFFFF
    return b"".join(
        (packet[:1], bytes((marked,)), packet[2:10], checksum.to_bytes(2, "big"), packet[12:])
    )
