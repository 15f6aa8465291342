"""Retransmits per request (bpf/agent/tcp.h): the BTF fields the retransmit programs read,
compiled in as -D offsets, each group optional.

* ``PX_RTX_SEGS``: the segments a retransmitted skb carries (``skb_shinfo(skb)->gso_segs``,
  as the kernel's TcpRetransSegs counts them); without it each retransmitted skb counts 1.
* ``PX_RTX_DATA_WAIT``: the wait of a data or FIN retransmission — the write that queued
  the bytes (``tcp_sock.write_seq``, marked at each write), found from the skb's sequence
  number (``TCP_SKB_CB(skb)->seq``, the first member of ``sk_buff.cb``).
* ``PX_RTX_SYN_WAIT``: the wait of a SYN-ACK retransmission, from the first SYN-ACK's send
  time the kernel keeps (``tcp_request_sock.snt_synack``).

Where a group's fields are missing from the running kernel's BTF, that part is not measured
(the counts stay; a wait is never guessed) and the agent says so once.
"""

from __future__ import annotations

import logging

from agent.kernel import btf

log = logging.getLogger("parallax.agent")

_GROUPS: dict[str, dict[str, tuple[str, str]]] = {
    "PX_RTX_SEGS": {
        "PX_OFF_RTX_SKB_HEAD": ("sk_buff", "head"),
        "PX_OFF_RTX_SKB_END": ("sk_buff", "end"),
        "PX_OFF_RTX_GSO_SEGS": ("skb_shared_info", "gso_segs"),
    },
    "PX_RTX_DATA_WAIT": {
        "PX_OFF_RTX_WRITE_SEQ": ("tcp_sock", "write_seq"),
        "PX_OFF_RTX_SKB_CB": ("sk_buff", "cb"),
    },
    "PX_RTX_SYN_WAIT": {
        "PX_OFF_RTX_SNT_SYNACK": ("tcp_request_sock", "snt_synack"),
    },
}
_WHAT = {
    "PX_RTX_SEGS": "a retransmitted GSO skb counts 1, not its segments",
    "PX_RTX_DATA_WAIT": "no retransmit wait for data",
    "PX_RTX_SYN_WAIT": "no retransmit wait for SYN-ACKs",
}


def cflags(degraded: list[str]) -> list[str]:
    """The -D flags of the groups whose fields the kernel's BTF has; one degraded line per
    group it lacks."""
    wanted = [key for group in _GROUPS.values() for key in group.values()]
    off = btf.member_offsets(wanted)
    flags: list[str] = []
    for group, fields in _GROUPS.items():
        missing = [f"{s}.{m}" for s, m in fields.values() if off[(s, m)] is None]
        if missing:
            line = f"{', '.join(missing)} not in the kernel's BTF: {_WHAT[group]}"
            log.warning("degraded: %s", line)
            degraded.append(line)
            continue
        flags.append(f"-D{group}")
        flags += [f"-D{macro}={off[key]}" for macro, key in fields.items()]
    return flags
