// Builds dist/parallax.min.js (IIFE, global `Parallax`) and dist/parallax.esm.js, checks the
// gzip size budget, and with --tests bundles test/*.test.ts for `node --test`.
import { build } from "esbuild";
import { readFileSync, readdirSync, mkdirSync, writeFileSync } from "node:fs";
import { execFileSync } from "node:child_process";
import { gzipBytes, iife } from "./iife.mjs";

// What the probe weighs (issue 20: 4 567 from 5 044; issue 31 added the LLM stream reader,
// src/llm.ts, +1 133: over the 5 000 asked for — docs/probe.md "Size" says what each feature
// costs and which cuts would get there). A change that adds bytes raises this knowingly, in
// the same commit.
const BUDGET_GZIP_BYTES = 5700;
const common = { bundle: true, minify: true, target: ["es2020"], legalComments: "none" };

if (process.argv.includes("--tests") || process.argv.includes("--otel")) {
  // OpenTelemetry web + its fetch instrumentation, for the browser load-order tests; the
  // openai and ai SDKs, for the browser token tests.
  for (const [entry, out] of [["otel", "otel"], ["llm_clients", "llm"]])
    await build({ entryPoints: [`test/browser/${entry}.ts`], outfile: `build/${out}.js`, bundle: true,
      format: "iife", target: ["es2020"], minify: true, legalComments: "none" });
}
if (process.argv.includes("--tests")) {
  const tests = readdirSync("test").filter((f) => f.endsWith(".test.ts"));
  mkdirSync("build/test", { recursive: true });
  await build({
    entryPoints: tests.map((f) => `test/${f}`), outdir: "build/test", bundle: true,
    platform: "node", format: "esm", outExtension: { ".js": ".mjs" }, packages: "external",
  });
} else {
  mkdirSync("dist", { recursive: true });
  writeFileSync("dist/parallax.min.js", await iife());
  await build({ ...common, entryPoints: ["src/index.ts"], outfile: "dist/parallax.esm.js",
    format: "esm" });
  execFileSync("node_modules/.bin/tsc", ["-p", "."], { stdio: "inherit" });
  const gz = gzipBytes(readFileSync("dist/parallax.min.js"));
  if (gz > BUDGET_GZIP_BYTES) {
    console.error(`js_probe: dist/parallax.min.js is ${gz} B gzip, over the ${BUDGET_GZIP_BYTES} B budget`);
    process.exit(1);
  }
  console.log(`js_probe: dist/parallax.min.js ${gz} B gzip (budget ${BUDGET_GZIP_BYTES} B)`);
}
