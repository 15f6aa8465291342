import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { parseTraceparent, formatTraceparent, generateTraceContext } from "../src/traceContext";

interface Vector { input: string; valid: boolean; trace_id?: string; span_id?: string; flags?: number; note: string }
const vectors: Vector[] = JSON.parse(
  readFileSync(new URL("../../../docs/contracts/traceparent-vectors.json", import.meta.url), "utf8"),
).vectors;

test("shared traceparent vectors", () => {
  assert.ok(vectors.length > 20);
  for (const v of vectors) {
    const got = parseTraceparent(v.input);
    if (!v.valid) {
      assert.equal(got, null, `${v.note}: ${JSON.stringify(v.input)}`);
      continue;
    }
    assert.deepEqual(got, { traceId: v.trace_id, spanId: v.span_id, flags: v.flags }, v.note);
  }
});

test("generated contexts round-trip and carry the sampled flag", () => {
  for (let i = 0; i < 200; i++) {
    const sampled = i % 2 === 0;
    const tc = generateTraceContext(sampled);
    const back = parseTraceparent(formatTraceparent(tc));
    assert.deepEqual(back, tc);
    assert.equal((tc.flags & 1) === 1, sampled);
  }
});
