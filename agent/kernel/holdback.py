"""Write-to-wire holdback (bpf/agent/hold.h): the BTF fields its programs read, compiled in
as -D offsets, and its departure hook (net:net_dev_queue: a BTF tracepoint where the kernel
loads one, else a raw tracepoint)."""

from __future__ import annotations

import logging
import os
from typing import Any

from agent.kernel import btf, tpbtf

log = logging.getLogger("parallax.agent")
NO_HOLDS = "PARALLAX_AGENT_NO_HOLDS"  # bench: the agent without the measure, side by side
RAW_XMIT = "PARALLAX_AGENT_HOLD_RAW_TP"  # bench, tests: the departure hook as a raw tracepoint
XMIT, XMIT_FN = b"net_dev_queue", b"px_hold_xmit"
XMIT_TYPEDEF, XMIT_BTF_FN = "btf_trace_net_dev_queue", "px_hold_xmit_btf"
# Write-to-wire holdback (bpf/agent/hold.h): the fields it reads, by macro. tcp_sock.nonagle
# is a bitfield (its byte and shift); the rest whole members.
_HOLD_FIELDS = {
    "PX_OFF_TCP_WRITE_SEQ": ("tcp_sock", "write_seq"),
    "PX_OFF_TCP_SND_NXT": ("tcp_sock", "snd_nxt"),
    "PX_OFF_TCP_SND_UNA": ("tcp_sock", "snd_una"),
    "PX_OFF_TCP_SND_WND": ("tcp_sock", "snd_wnd"),
    "PX_OFF_TCP_SND_CWND": ("tcp_sock", "snd_cwnd"),
    "PX_OFF_TCP_PACKETS_OUT": ("tcp_sock", "packets_out"),
    "PX_OFF_TCP_MSS_CACHE": ("tcp_sock", "mss_cache"),
    "PX_OFF_TCP_NONAGLE": ("tcp_sock", "nonagle"),
    "PX_OFF_SKB_SK": ("sk_buff", "sk"),
    "PX_OFF_SKB_HEAD": ("sk_buff", "head"),
    "PX_OFF_SKB_DATA": ("sk_buff", "data"),
    "PX_OFF_SKB_LEN": ("sk_buff", "len"),
    "PX_OFF_SKB_TH": ("sk_buff", "transport_header"),
}
_HOLD_SIZES = {"PX_OFF_TCP_NONAGLE": 4}  # the bitfields among them, by width


def cflags(degraded: list[str]) -> tuple[list[str], int | None]:
    """The -D flags of the write-to-wire holdback measure, or none (with a degraded line)
    where the running kernel's BTF lacks a field it reads; and the BTF id of the departure
    hook's tracepoint (None: the raw tracepoint only)."""
    if os.environ.get(NO_HOLDS):
        return [], None
    bits = btf.member_bits(list(_HOLD_FIELDS.values()))
    flags = ["-DPX_HOLDS"]
    for macro, key in _HOLD_FIELDS.items():
        got = bits[key]
        want = _HOLD_SIZES.get(macro, 0)
        if got is None or (got[1] and got[1] != want) or (not got[1] and got[0] % 8):
            line = f"{key[0]}.{key[1]} not in the kernel's BTF: write-to-wire holdback not measured"
            log.warning("degraded: %s", line)
            degraded.append(line)
            return [], None
        flags.append(f"-D{macro}={got[0] // 8}")
        if macro == "PX_OFF_TCP_NONAGLE":
            flags.append(f"-DPX_SHIFT_TCP_NONAGLE={got[0] % 8}")
    xmit_id = btf.lookup([], [XMIT_TYPEDEF])[1][XMIT_TYPEDEF]  # the parse above, cached
    if xmit_id is not None:
        flags.append("-DPX_HOLD_BTF")
    return flags, xmit_id


def attach(b: Any, degraded: list[str], btf_id: int | None) -> list[str]:
    """Attach the departure hook, as a BTF tracepoint where ``btf_id`` is given and the
    kernel loads it (the tracepoint's name when so), else the raw one; where both fail the
    writes are still checked, and each held one is counted untimed."""
    if (
        btf_id is not None
        and not os.environ.get(RAW_XMIT)
        and tpbtf.attach_in_place(b, XMIT_BTF_FN, "net:net_dev_queue", btf_id)
    ):
        return [XMIT.decode()]
    try:
        b.attach_raw_tracepoint(tp=XMIT, fn_name=XMIT_FN)
    except Exception as e:  # noqa: BLE001  (bcc raises bare Exception)
        line = f"net:net_dev_queue did not attach ({e}): write-to-wire holdback untimed"
        log.warning("degraded: %s", line)
        degraded.append(line)
    return []
