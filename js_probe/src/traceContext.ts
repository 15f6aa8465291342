// W3C Trace Context (traceparent): the one TypeScript implementation.
// Tested against docs/contracts/traceparent-vectors.json, like the Python one.

export interface TraceContext {
  traceId: string; // 32 lowercase hex, not all zero
  spanId: string; // 16 lowercase hex, not all zero
  flags: number;
}

export const FLAG_SAMPLED = 0x01;
export const FLAG_RANDOM = 0x02;
// version-flags, then "-" and more only for a future version (checked below).
const RE = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-|$)/;
const ZERO = /^0+$/;

export function parseTraceparent(value: string | null | undefined): TraceContext | null {
  if (typeof value !== "string") return null;
  const m = RE.exec(value.replace(/^[ \t]+|[ \t]+$/g, ""));
  // ff is invalid; version 00 is exactly 55 characters; all-zero ids are invalid.
  if (!m || m[1] === "ff" || (m[1] === "00" && m[5]) || ZERO.test(m[2] as string) || ZERO.test(m[3] as string))
    return null;
  return { traceId: m[2] as string, spanId: m[3] as string, flags: parseInt(m[4] as string, 16) };
}

export function formatTraceparent(tc: TraceContext): string {
  return `00-${tc.traceId}-${tc.spanId}-${(tc.flags & 0xff).toString(16).padStart(2, "0")}`;
}

function randomHex(bytes: number): string {
  const a = new Uint8Array(bytes);
  do crypto.getRandomValues(a);
  while (a.every((b) => !b)); // all-zero ids are invalid
  return Array.from(a, (b) => (b < 16 ? "0" : "") + b.toString(16)).join("");
}

export const newTraceId = (): string => randomHex(16);
export const newSpanId = (): string => randomHex(8);

/** A fresh root context; ids are random, so the level-2 random flag is set. */
export function generateTraceContext(sampled: boolean): TraceContext {
  return { traceId: newTraceId(), spanId: newSpanId(), flags: FLAG_RANDOM | (sampled ? FLAG_SAMPLED : 0) };
}
