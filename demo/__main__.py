"""The demo, as far as the project goes today: the host check and the shared contracts.

Later issues grow it into the full pipeline (agent + collector + probe in Chromium)."""

from __future__ import annotations

import sys

from agent import doctor
from parallax_contracts import routes, trace_context


def main() -> int:
    print("Parallax demo — what exists today: the host check and the shared contracts.\n")
    print("1. Can this host run the eBPF agent? (parallax-agent doctor)\n")
    rc = doctor.main()
    print("\n2. Trace context: what the browser probe sends and the agent reads\n")
    tc = trace_context.generate(sampled=True)
    print(f"   traceparent: {tc.header()}")
    print(f"   parsed back: trace_id={tc.trace_id} parent span={tc.span_id} sampled={tc.sampled}")
    print("\n3. Route templates: how paths become low-cardinality routes\n")
    for p in ("/v1/chat/42", "/items/123e4567-e89b-12d3-a456-426614174000", "/c/a1b2c3d4?x=1"):
        print(f"   {p:50} → {routes.route_template(p)}")
    print("\nNot built yet: the agent's probes, the collector, the browser probe, the SLA check.")
    return rc


if __name__ == "__main__":
    sys.exit(main())
