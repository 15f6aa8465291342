// Builds dist/parallax.min.js (IIFE, global `Parallax`) and dist/parallax.esm.js, checks the
// gzip size budget, and with --tests bundles test/*.test.ts for `node --test`.
import { build } from "esbuild";
import { minify } from "terser";
import { readFileSync, readdirSync, mkdirSync, writeFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { execFileSync } from "node:child_process";

const BUDGET_GZIP_BYTES = 5 * 1024; // issue: ≤ 5 KB gzip, aim for 4 KB
const common = { bundle: true, minify: true, target: ["es2020"], legalComments: "none" };
// Fields of the probe's internal objects, renamed in the <script> build (esbuild mangleProps).
// Only names that are never a DOM, Options or beacon field: a name added here must not occur
// as a property anywhere else in src/. The ESM build keeps them (parseTraceparent's result is
// public there).
const INTERNAL_PROPS = [
  "traceId", "spanId", "flags", // TraceContext
  "render", "sink", // core's cfg
  "to", "head", "batch", "bound", "interval", "post", "beacon", // TransportOptions
  "tp", "cur", "tc", // XHR and WebSocket state
];

if (process.argv.includes("--tests") || process.argv.includes("--otel")) {
  // OpenTelemetry web + its fetch instrumentation, for the browser load-order tests.
  await build({ entryPoints: ["test/browser/otel.ts"], outfile: "build/otel.js", bundle: true,
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
  // IIFE: src/global.ts assigns window.Parallax itself (smaller than esbuild's globalName).
  // Sloppy mode (no "use strict" prologue): nothing in the probe depends on strict semantics.
  await build({ ...common, entryPoints: ["src/global.ts"], outfile: "dist/parallax.min.js",
    format: "iife", mangleProps: new RegExp(`^(${INTERNAL_PROPS.join("|")})$`),
    tsconfigRaw: { compilerOptions: { alwaysStrict: false, strict: false } } });
  // A second pass with terser: ~4% smaller than esbuild alone, which counts against 5 KB.
  const iife = await minify(readFileSync("dist/parallax.min.js", "utf8"), {
    ecma: 2020, toplevel: true, compress: { passes: 3, pure_getters: true },
    mangle: true, format: { comments: false },
  });
  writeFileSync("dist/parallax.min.js", iife.code ?? "");
  await build({ ...common, entryPoints: ["src/index.ts"], outfile: "dist/parallax.esm.js",
    format: "esm" });
  execFileSync("node_modules/.bin/tsc", ["-p", "."], { stdio: "inherit" });
  const gz = gzipSync(readFileSync("dist/parallax.min.js"), { level: 9 }).length;
  if (gz > BUDGET_GZIP_BYTES) {
    console.error(`js_probe: dist/parallax.min.js is ${gz} B gzip, over the ${BUDGET_GZIP_BYTES} B budget`);
    process.exit(1);
  }
  console.log(`js_probe: dist/parallax.min.js ${gz} B gzip (budget ${BUDGET_GZIP_BYTES} B)`);
}
