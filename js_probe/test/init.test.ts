// init() where the browser lacks what the probe needs (here: Node, no document) is a no-op,
// and no input makes it throw.
import { test } from "node:test";
import assert from "node:assert/strict";
import { flush, init, markRendered } from "../src/index";

test("init is a no-op without a document and never throws", () => {
  const fetchBefore = globalThis.fetch;
  for (const o of [undefined, null, {}, { endpoint: "::bad" }, { endpoint: "https://c.example/v1/beacons", site: "s" }])
    assert.doesNotThrow(() => init(o as never));
  assert.equal(globalThis.fetch, fetchBefore, "nothing wrapped");
  assert.doesNotThrow(() => markRendered("0af7651916cd43dd8448eb211c80319c"));
  assert.doesNotThrow(() => flush());
});
