// Parallax browser probe: public entry point. The instrumentation grows in the probe issue;
// today it exposes the shared trace-context contract.
export { parseTraceparent, formatTraceparent, generateTraceContext } from "./traceContext";
export const version = "0.1.0";
