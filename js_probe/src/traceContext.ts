// W3C Trace Context (traceparent): the one TypeScript implementation.
// Tested against docs/contracts/traceparent-vectors.json, like the Python one.

export interface TraceContext {
  traceId: string; // 32 lowercase hex, not all zero
  spanId: string; // 16 lowercase hex, not all zero
  flags: number;
}

// Optional blanks (OWS) around; version (never ff), trace id and span id (never all zero),
// flags; then "-" and more only for a future version (checked below).
const RE = /^[ \t]*(?!ff)([\da-f]{2})-(?!0{32})([\da-f]{32})-(?!0{16})([\da-f]{16})-([\da-f]{2})(?:(-)|[ \t]*$)/;

export function parseTraceparent(value: string | null | undefined): TraceContext | null {
  const m = RE.exec(value as string); // null and undefined never match
  // Version 00 is exactly 55 characters.
  return m && !(m[1] == "00" && m[5]) ? { traceId: m[2]!, spanId: m[3]!, flags: parseInt(m[4]!, 16) } : null;
}

/** Two lowercase hex digits. */
const hex2 = (b: number): string => (b | 256).toString(16).slice(1);

export const formatTraceparent = (tc: TraceContext): string => `00-${tc.traceId}-${tc.spanId}-${hex2(tc.flags)}`;

/** `bytes` random bytes as lowercase hex, never all zero (all-zero ids are invalid). */
export function randomHex(bytes: number): string {
  const a = new Uint8Array(bytes);
  do crypto.getRandomValues(a);
  while (a.every((b) => !b));
  return Array.from(a, hex2).join("");
}

/** A fresh root context; ids are random, so the level-2 random flag (2) is set; sampled: 1. */
export const generateTraceContext = (sampled: boolean): TraceContext => ({
  traceId: randomHex(16),
  spanId: randomHex(8),
  flags: 2 | +sampled,
});
