// W3C Trace Context (traceparent): the one TypeScript implementation.
// Tested against docs/contracts/traceparent-vectors.json, like the Python one.

export interface TraceContext {
  traceId: string; // 32 lowercase hex, not all zero
  spanId: string; // 16 lowercase hex, not all zero
  flags: number;
}

export const FLAG_SAMPLED = 0x01;
export const FLAG_RANDOM = 0x02;
const HEX = /^[0-9a-f]+$/;
const isHex = (s: string, n: number): boolean => s.length === n && HEX.test(s);

export function parseTraceparent(value: string | null | undefined): TraceContext | null {
  if (typeof value !== "string") return null;
  const v = value.replace(/^[ \t]+|[ \t]+$/g, "");
  if (v.length < 55 || v[2] !== "-" || v[35] !== "-" || v[52] !== "-") return null;
  const version = v.slice(0, 2);
  const traceId = v.slice(3, 35);
  const spanId = v.slice(36, 52);
  const flags = v.slice(53, 55);
  if (!isHex(version, 2) || !isHex(traceId, 32) || !isHex(spanId, 16) || !isHex(flags, 2)) return null;
  if (version === "ff") return null;
  if (version === "00" ? v.length !== 55 : v.length > 55 && v[55] !== "-") return null;
  if (/^0+$/.test(traceId) || /^0+$/.test(spanId)) return null;
  return { traceId, spanId, flags: parseInt(flags, 16) };
}

export function formatTraceparent(tc: TraceContext): string {
  return `00-${tc.traceId}-${tc.spanId}-${(tc.flags & 0xff).toString(16).padStart(2, "0")}`;
}

function randomHex(bytes: number): string {
  const a = new Uint8Array(bytes);
  let zero = true;
  while (zero) {
    crypto.getRandomValues(a);
    zero = a.every((b) => b === 0);
  }
  let s = "";
  for (const b of a) s += (b < 16 ? "0" : "") + b.toString(16);
  return s;
}

export const newTraceId = (): string => randomHex(16);
export const newSpanId = (): string => randomHex(8);

/** A fresh root context; ids are random, so the level-2 random flag is set. */
export function generateTraceContext(sampled: boolean): TraceContext {
  return { traceId: newTraceId(), spanId: newSpanId(), flags: FLAG_RANDOM | (sampled ? FLAG_SAMPLED : 0) };
}
