# Type stub for the compiled HTTP/1 head parser (_http1_fast.c; built by
# parallax_contracts/compiled.py).
from collections.abc import Callable

from agent.protocols.http1_head import RequestHead, ResponseHead
from parallax_contracts.trace_context import TraceContext

def configure(
    request_type: type[RequestHead],
    response_type: type[ResponseHead],
    trace_parse: Callable[[str], TraceContext | None],
    clean_path: Callable[[str], str],
    query_traceparent: Callable[[str], str | None],
    server_traceparent: Callable[[bytes], TraceContext | None],
    methods: dict[bytes, str],
) -> None: ...
def parse_request(head: bytes) -> RequestHead | None: ...
def parse_response(data: bytes) -> ResponseHead | None: ...
