// The ESM build (dist/parallax.esm.js): the probe, whose token reader is a dynamic import of
// the module next to it — the build points "./llm" at dist/parallax-llm.min.js, and a
// consumer's bundler makes that a chunk of its own, loaded when the page's first LLM candidate
// stream arrives.
import { start, type Options } from "./probe";

export { flush, markRendered, version, type Options } from "./probe";
export { formatTraceparent, generateTraceContext, parseTraceparent } from "./traceContext";

/** Start the probe. Idempotent; a no-op where the browser lacks what it needs; never throws. */
export const init = (o: Options): void =>
  start(o, o?.llmReader ? undefined : (done) => void import("./llm").then(done, done));
