// OpenTelemetry web tracing with its fetch instrumentation, bundled for the browser tests of
// load order (tests/probe/test_otel_order.py): `startOtel([origins])` installs it and
// `otelSpans()` lists the client spans it made (trace id, span id).
import { registerInstrumentations } from "@opentelemetry/instrumentation";
import { FetchInstrumentation } from "@opentelemetry/instrumentation-fetch";
import { InMemorySpanExporter, SimpleSpanProcessor, WebTracerProvider } from "@opentelemetry/sdk-trace-web";

const esc = (s: string): string => s.replace(/[.*+?^${}()|[\]\\/]/g, "\\$&");
const exporter = new InMemorySpanExporter();
const g = globalThis as Record<string, unknown>;

g.startOtel = (propagateTo: string[]): void => {
  const provider = new WebTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  provider.register();
  registerInstrumentations({
    instrumentations: [
      new FetchInstrumentation({ propagateTraceHeaderCorsUrls: propagateTo.map((o) => new RegExp("^" + esc(o))) }),
    ],
  });
};
g.otelSpans = (): { traceId: string; spanId: string }[] =>
  exporter.getFinishedSpans().map((s) => ({ traceId: s.spanContext().traceId, spanId: s.spanContext().spanId }));
