"""The rows of the written tables, one typed NamedTuple each, in column order.

Generated from collector/store/schema.py by ``python -m collector.store.rowgen``: do not
edit; a column added there is added here by running it (tests/collector/test_rows.py
checks the two agree)."""

from __future__ import annotations

from typing import NamedTuple


class SpanRow(NamedTuple):
    """One server span as the OTLP parsers write it. (schema.SPANS)"""

    time: int  # ns since the epoch
    end_time: int  # ns since the epoch
    received: int  # ms since the epoch
    trace_id: str
    span_id: str
    parent_span_id: str
    span_name: str
    source: str
    service: str
    host: str
    pid: int
    method: str
    route: str
    path: str
    status: int
    server_address: str
    server_port: int
    client_address: str
    client_port: int
    arrival: int | None  # ns since the epoch
    ttfb_us: int | None
    recv_queue_us: int | None
    accept_queue_us: int | None
    ttft_us: int | None
    duration_us: int
    chunk_offsets_us: list[int]
    chunks: int | None
    chunk_gap_max_us: int | None
    bytes_in: int | None
    bytes_out: int | None
    srtt_us: int | None
    retransmits: int | None
    ws_seq: int
    partial: bool
    client_aborted: bool
    traceparent_missed: bool
    attributes: dict[str, str]
    gpu_prefill_launches: int | None
    gpu_decode_launches: int | None
    gpu_prefill_wait_us: int | None
    gpu_decode_wait_us: int | None
    gpu_prefill_sm_util_pct: float | None
    gpu_decode_sm_util_pct: float | None
    gpu_sample_coverage: float | None
    gpu_inflight_mean: float | None
    gpu_uuid: str
    sample_th: int


class EntryRow(NamedTuple):
    """One browser entry as the beacon parser writes it. (schema.ENTRIES)"""

    time: int  # µs since the epoch
    received: int  # ms since the epoch
    site: str
    session: str
    page: str
    trace_id: str
    span_id: str
    kind: str
    seq: int
    method: str
    url: str
    route: str
    status: int | None
    time_origin_ms: float
    start_ms: float
    request_start_ms: float | None
    response_start_ms: float | None
    response_end_ms: float | None
    dns_ms: float | None
    connect_ms: float | None
    tls_ms: float | None
    first_chunk_ms: float | None
    chunk_ms: list[float]
    chunks: int | None
    rendered_ms: float | None
    coarse: bool
    chunks_coarse: bool
    hidden: bool
    transfer_size: int | None
    protocol: str
    server_timing: str
    error: str
    clock_drift_ms: float | None
    sdk: str
    llm_dialect: str
    llm_first_token_ms: float | None
    llm_first_output_ms: float | None
    llm_token_ms: list[float]
    llm_gap_hist: list[int]
    llm_tokens: int | None
    llm_tokens_source: str
    llm_end: str
    llm_bad_events: int | None


class PairRow(NamedTuple):
    """One pair as the pairing writes it. (schema.PAIRS)"""

    time: int  # µs since the epoch
    version: int
    paired_at: int  # ms since the epoch
    site: str
    session: str
    service: str
    route: str
    method: str
    status: int
    kind: str
    trace_id: str
    span_id: str
    seq: int
    coarse: bool
    chunks_coarse: bool
    user_ttfb_ms: float | None
    user_ttft_ms: float | None
    user_visible_ttft_ms: float | None
    user_duration_ms: float | None
    user_itl_ms: list[float]
    render_delay_ms: float | None
    server_ttfb_ms: float | None
    server_ttft_ms: float | None
    server_duration_ms: float | None
    server_itl_ms: list[float]
    server_timed: bool
    hops: int
    hop_span_ids: list[str]
    hop_services: list[str]
    hop_added_ms: list[float]
    edge_itl_ms: list[float]
    linked_span_ids: list[str]
    reconnects: int
    network_ms: float | None
    queue_ms: float | None
    accept_queue_ms: float | None
    recv_queue_ms: float | None
    retransmits: int | None
    srtt_ms: float | None
    theta_ms: float | None
    theta_delay_ms: float | None
    sample_th: int
    wire_hold_ms: float | None
    wire_hold_reason: str
    llm_dialect: str
    llm_model: str
    llm_end: str
    user_llm_end: str
    user_first_token_ms: float | None
    server_first_token_ms: float | None
    user_token_gap_p95_ms: float | None
    server_token_gap_p95_ms: float | None
    user_tokens: int | None
    server_tokens: int | None
    llm_queue_ms: float | None
    llm_prefill_ms: float | None
    llm_decode_ms: float | None
    retransmit_wait_ms: float | None


class GpuSampleRow(NamedTuple):
    """One GPU metric point as the OTLP metrics parser writes it. (schema.GPU_SAMPLES)"""

    time: int  # ns since the epoch
    start_time: int | None  # ns since the epoch
    host: str
    service: str
    hw_id: str
    hw_name: str
    pid: int
    metric: str
    value: float
    temporality: str
    attributes: dict[str, str]


class CountRow(NamedTuple):
    """One request-count point as the OTLP metrics parser writes it. (schema.REQUEST_COUNTS)"""

    time: int  # ns since the epoch
    start_time: int | None  # ns since the epoch
    host: str
    service: str
    port: int
    metric: str
    value: float
    temporality: str
