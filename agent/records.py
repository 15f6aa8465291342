"""Record assembly: an exchange (:mod:`agent.protocols.exchange`) plus connection and process
identity → the exported record (JSON object; OTel span attributes use the names of
parallax_contracts.span_attributes)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agent.kernel.clock import MonoClock
from agent.kernel.events import Hold
from agent.protocols.exchange import Exchange
from agent.protocols.streams.stream import CLIENT_ABORTED, Stream
from parallax_contracts import genai, sampling, trace_context
from parallax_contracts import span_attributes as sa


@dataclass(frozen=True, slots=True)
class ConnInfo:
    pid: int
    comm: str
    service: str
    local_addr: str
    local_port: int
    peer_addr: str
    peer_port: int
    tls: bool = False  # the plaintext came from the TLS library probes (agent/kernel/tls_probes.py)


class _Ids:
    """Random ids from a buffered pool of os.urandom (one getrandom per 512 span ids, not
    one per id), kept as hex text so that an id is one slice; all-zero ids are invalid in
    W3C trace context and skipped."""

    _SIZE = 4096

    def __init__(self) -> None:
        self._hex = ""
        self._pos = 0
        self._zero = {n: "0" * n for n in (16, 32)}

    def take(self, n: int) -> str:
        """``n`` random bytes as lowercase hex (2n characters)."""
        width = 2 * n
        while True:
            pos = self._pos
            if pos + width > len(self._hex):
                self._hex = os.urandom(self._SIZE).hex()
                pos = 0
            self._pos = pos + width
            h = self._hex[pos : pos + width]
            if h != (self._zero.get(width) or "0" * width):
                return h


_ids = _Ids()
_TH_HEX: dict[int, str] = {0: "0"}  # the few thresholds in use, formatted once


def _th_hex(th32: int) -> str:
    if len(_TH_HEX) > 1024:
        _TH_HEX.clear()
        _TH_HEX[0] = "0"
    h = _TH_HEX[th32] = sampling.th_hex(sampling.th_from_th32(th32))
    return h


# The record's fields in their order (the JSONL output keeps it), every one absent (None)
# until set. A record is this dict copied, then its measured fields set: ~0.7 µs against
# ~1.9 for a 46-key dict display, which hashes and inserts every key again per request
# (docs/benchmarks.md, "Spans to OTLP, and the record built from a copy").
_FIELDS = (
    "trace_id", "span_id", "parent_span_id", "trace_flags", "method", "path", "version",
    "status", "pid", "comm", "service", "local_addr", "local_port", "peer_addr", "peer_port",
    "start_unix_ns", "end_unix_ns", "arrival_unix_ns", "ttfb_us", "recv_queue_us",
    "accept_queue_us", "ttft_us", "first_chunk_us", "chunk_offsets_us", "chunks",
    "chunk_gap_max_us", "duration_us", "bytes_in", "bytes_out", "srtt_us", "retransmits",
    "retransmit_wait_us", "ws_seq", "partial", "client_aborted", "traceparent_missed",
    "source", "tls", "sample_th", "rpc_system", "grpc_status",
    "wire_hold_writes", "wire_hold_max_us", "wire_hold_sum_us", "wire_hold_bytes",
    "wire_hold_reason", "wire_hold_untimed",
)  # fmt: skip
_BLANK: dict[str, Any] = {**dict.fromkeys(_FIELDS), "source": sa.SOURCE_EBPF}


def build(ex: Exchange, conn: ConnInfo, clock: MonoClock) -> dict[str, Any]:
    # Durations: (a − b) in µs, None when either instant is unknown (0), never negative;
    # written out inline, without max() (a record is built per request). Fields left
    # None here are absent: the blank record has them so.
    tp = ex.traceparent
    t1 = ex.t1
    t2 = ex.t2
    t_end = ex.t_end or t2 or t1
    t_arr = ex.t_arr
    t_acc = ex.t_acc
    t_est = ex.t_est
    t_tok = ex.t_tok
    off = clock.offset_ns
    rec = _BLANK.copy()
    if tp is not None:
        rec["trace_id"] = tp.trace_id
        rec["span_id"] = _ids.take(8)
        rec["parent_span_id"] = tp.span_id
        rec["trace_flags"] = tp.flags
    else:
        rec["trace_id"] = _ids.take(16)
        rec["span_id"] = _ids.take(8)
        rec["trace_flags"] = trace_context.FLAG_SAMPLED
    rec["method"] = ex.method
    rec["path"] = ex.path
    rec["version"] = ex.version
    if ex.status:
        rec["status"] = ex.status
    rec["pid"] = conn.pid
    rec["comm"] = conn.comm
    rec["service"] = conn.service
    rec["local_addr"] = conn.local_addr
    rec["local_port"] = conn.local_port
    rec["peer_addr"] = conn.peer_addr
    rec["peer_port"] = conn.peer_port
    rec["start_unix_ns"] = t1 + off
    rec["end_unix_ns"] = t_end + off
    if t1:
        if t_arr:
            rec["arrival_unix_ns"] = t_arr + off
            start_arr = t_arr if t_arr > t_acc else t_acc
            rec["recv_queue_us"] = (t1 - start_arr) // 1000 if t1 > start_arr else 0
        if t2:
            rec["ttfb_us"] = (t2 - t1) // 1000 if t2 > t1 else 0
        if t_tok:
            rec["ttft_us"] = rec["first_chunk_us"] = (t_tok - t1) // 1000 if t_tok > t1 else 0
    elif t_arr:
        rec["arrival_unix_ns"] = t_arr + off
    if t_acc and t_est:
        rec["accept_queue_us"] = (t_acc - t_est) // 1000 if t_acc > t_est else 0
    chunks = ex.chunks
    rec["chunk_offsets_us"] = ex.chunk_offs_us
    rec["chunks"] = chunks
    if chunks > 1:
        rec["chunk_gap_max_us"] = ex.gap_max_ns // 1000
    rec["duration_us"] = (t_end - t1) // 1000 if t_end > t1 else 0
    rec["bytes_in"] = ex.bytes_in
    rec["bytes_out"] = ex.bytes_out
    if ex.srtt_us:
        rec["srtt_us"] = ex.srtt_us
    rec["retransmits"] = ex.retransmits
    rec["retransmit_wait_us"] = ex.retransmit_wait_us
    if ex.ws_seq:
        rec["ws_seq"] = ex.ws_seq
    rec["partial"] = ex.partial
    rec["client_aborted"] = ex.client_aborted
    rec["traceparent_missed"] = ex.traceparent_missed
    rec["tls"] = conn.tls
    # the kernel's sampling threshold (OpenTelemetry's th, hex; "0": every request kept)
    rec["sample_th"] = _TH_HEX.get(ex.sample_th) or _th_hex(ex.sample_th)
    # HTTP/2 streams of gRPC (agent/protocols/http2.py): "grpc" and the trailers' grpc-status
    rec["rpc_system"] = ex.rpc_system
    rec["grpc_status"] = ex.grpc_status
    if ex.hold is not None:
        _hold_fields(rec, ex.hold)
    if ex.stream is not None and ex.stream.dialect is not None:
        _llm_fields(rec, ex.stream, t1, conn.service)
    return rec


def _us(t: int, t1: int) -> int | None:
    return ((t - t1) // 1000 if t > t1 else 0) if t and t1 else None


def _llm_fields(rec: dict[str, Any], s: Stream, t1: int, service: str) -> None:
    """An LLM stream's fields (parallax_contracts.genai): only what was measured; the text
    of the stream never reaches here."""
    d = s.dialect
    assert d is not None
    n, source = s.tokens
    g = s.gaps
    qs = g.quantiles((0.5, 0.95, 0.99))
    stalls = g.stalls_over_median()
    end = s.ending()
    first = _us(s.t_first_answer, t1)
    problem = s.problems.most_common(1)[0][0] if s.problems else None
    queue = prefill = None
    if s.lead_t and s.t_first_out:
        queue = (s.lead_t - t1) // 1000 if s.lead_t > t1 else 0
        prefill = (s.t_first_out - s.lead_t) // 1000
    rec.update(
        {
            "ttft_us": first,  # an LLM stream's TTFT is its first answer token's
            "client_aborted": end == CLIENT_ABORTED,
            "gen_ai_operation_name": s.operation or d.operation,
            "gen_ai_provider_name": genai.provider(d.provider, service),
            "gen_ai_response_model": s.model,
            "gen_ai_response_finish_reasons": s.finish_reasons or None,
            "gen_ai_usage_input_tokens": s.input_tokens,
            "gen_ai_usage_output_tokens": n,
            "gen_ai_request_stream": True,
            "gen_ai_response_time_to_first_chunk": first / 1e6 if first is not None else None,
            "error_type": s.error_type,
            "llm_dialect": d.name,
            "llm_first_output_us": _us(s.t_first_out, t1),
            "llm_last_output_us": _us(s.t_last_out, t1),
            "llm_output_tokens_source": source,
            "llm_content_events": s.n_content,
            "llm_reasoning_events": s.n_reasoning,
            "llm_reasoning_tokens": s.reasoning_tokens,
            "llm_token_offsets_us": [(t - t1) // 1000 if t > t1 else 0 for t in s.offsets],
            "llm_gaps": g.n,
            "llm_gap_p50_us": qs[0],
            "llm_gap_p95_us": qs[1],
            "llm_gap_p99_us": qs[2],
            "llm_gap_max_us": g.max_us if g.n else None,
            "llm_gap_max_index": g.max_at if g.n else None,
            "llm_gaps_exact": g.is_exact if g.n else None,
            "llm_stall_tokens": [at for at, _ in stalls] or None,
            "llm_stall_gaps_us": [us for _, us in stalls] or None,
            "llm_queue_us": queue,
            "llm_prefill_us": prefill,
            "llm_engine_prefill_us": _ns_us(s.engine_prefill_ns),
            "llm_engine_decode_us": _ns_us(s.engine_decode_ns),
            "llm_engine_load_us": _ns_us(s.engine_load_ns),
            "llm_end": end,
            "llm_wasted_tokens": s.wasted if s.wasted_after else None,
            "llm_parse_problems": sum(s.problems.values()) or None,
            "llm_parse_problem": problem,
        }
    )


def _ns_us(ns: int | None) -> int | None:
    return ns // 1000 if ns is not None else None


def _hold_fields(rec: dict[str, Any], h: Hold) -> None:
    """Write-to-wire holdback (bpf/agent/hold.h), where measured (else absent: None)."""
    rec["wire_hold_writes"] = h.writes
    # none held: 0; held but none timed: unknown
    rec["wire_hold_max_us"] = h.max_us if h.writes else (None if h.untimed else 0)
    rec["wire_hold_sum_us"] = h.sum_us
    rec["wire_hold_bytes"] = h.bytes_max
    rec["wire_hold_reason"] = h.why or None
    rec["wire_hold_untimed"] = h.untimed


_ATTR_MAP: tuple[tuple[str, sa.Attr], ...] = (
    ("method", sa.HTTP_REQUEST_METHOD),
    ("path", sa.URL_PATH),
    ("status", sa.HTTP_RESPONSE_STATUS_CODE),
    ("local_addr", sa.SERVER_ADDRESS),
    ("local_port", sa.SERVER_PORT),
    ("peer_addr", sa.CLIENT_ADDRESS),
    ("peer_port", sa.CLIENT_PORT),
    ("version", sa.NETWORK_PROTOCOL_VERSION),
    ("ttfb_us", sa.TTFB_US),
    ("recv_queue_us", sa.RECV_QUEUE_US),
    ("accept_queue_us", sa.ACCEPT_QUEUE_US),
    ("arrival_unix_ns", sa.ARRIVAL_UNIX_NS),
    ("ttft_us", sa.TTFT_US),
    ("first_chunk_us", sa.FIRST_CHUNK_US),
    ("chunk_offsets_us", sa.CHUNK_OFFSETS_US),
    ("chunks", sa.CHUNKS),
    ("chunk_gap_max_us", sa.CHUNK_GAP_MAX_US),
    ("duration_us", sa.DURATION_US),
    ("bytes_in", sa.BYTES_IN),
    ("bytes_out", sa.BYTES_OUT),
    ("srtt_us", sa.SRTT_US),
    ("retransmits", sa.RETRANSMITS),
    ("retransmit_wait_us", sa.RETRANSMIT_WAIT_US),
    ("ws_seq", sa.WS_SEQ),
    ("rpc_system", sa.RPC_SYSTEM),
    ("grpc_status", sa.RPC_GRPC_STATUS_CODE),
    ("source", sa.SOURCE),
    *((sa.record_field(a), a) for a in sa.WIRE_HOLD),
    *((sa.record_field(a), a) for a in sa.GPU),
    *((sa.record_field(a), a) for a in genai.ALL if a.type != "bool"),
)
_BOOL_ATTRS = (
    ("partial", sa.PARTIAL),
    ("client_aborted", sa.CLIENT_ABORTED),
    ("traceparent_missed", sa.TRACEPARENT_MISSED),
    *((sa.record_field(a), a) for a in genai.ALL if a.type == "bool"),
)


# The same, as the compiled OTLP encoder reads them (agent/export/_otlp_wire_fast.c):
# (field, attribute name, is an array) for the values — absent where None or an empty
# array —, (field, name) for the flags — present only where true.
SPAN_VALUES: tuple[tuple[str, str, bool], ...] = tuple(
    (key, attr.name, attr.type in ("int[]", "string[]")) for key, attr in _ATTR_MAP
)
SPAN_FLAGS: tuple[tuple[str, str], ...] = tuple((key, attr.name) for key, attr in _BOOL_ATTRS)


def span_attributes(rec: dict[str, Any]) -> dict[str, Any]:
    """The record's span attributes (contract names; absent values left out): its values,
    its flags, then its RPC names."""
    out: dict[str, Any] = {}
    for key, name, is_array in SPAN_VALUES:
        v = rec.get(key)
        if v is None or (is_array and not v):
            continue
        out[name] = v
    for key, name in SPAN_FLAGS:
        if rec.get(key):
            out[name] = True
    out.update(rpc_attributes(rec))
    return out


def rpc_attributes(rec: dict[str, Any]) -> dict[str, str]:
    """OpenTelemetry's RPC conventions for a gRPC call: the service and method from
    "/<service>/<method>"."""
    if rec.get("rpc_system") == "grpc":
        service, _, method = rec["path"].lstrip("/").partition("/")
        if service and method:
            return {sa.RPC_SERVICE.name: service, sa.RPC_METHOD.name: method}
    return {}
