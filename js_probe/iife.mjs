// The <script> build of the probe and the build of its token reader, shared by build.mjs
// (dist/parallax.min.js, dist/parallax-llm.min.js and their size budgets) and sizes.mjs
// (what each feature costs).
import { build } from "esbuild";
import { minify } from "terser";
import { gzipSync } from "node:zlib";
import { execFileSync } from "node:child_process";
import { basename, dirname } from "node:path";

// Fields of the probe's internal objects, renamed in the <script> build (esbuild mangleProps).
// Only names that are never a DOM, Options or beacon field: a name added here must not occur
// as a property anywhere else in src/. The ESM build keeps them (parseTraceparent's result is
// public there).
const INTERNAL_PROPS = [
  "traceId", "spanId", "flags", // TraceContext
  "render", "sink", "load", // core's cfg
  "to", "head", "batch", "bound", "interval", "post", "beacon", // TransportOptions
  "tp", "cur", "tc", // XHR and WebSocket state
];

/** The minified IIFE for `entry` (src/global.ts: window.Parallax, assigned by the module
 *  itself, which is smaller than esbuild's globalName namespace) — or, with `reader`, the
 *  token reader (src/llm.ts) as an ES module: the core imports it. The reader's build renames
 *  no property: it shares the core's objects (Rec, Entry), whose fields must read the same
 *  in both (and no field they share may be listed above). */
export async function iife(entry = "src/global.ts", reader = false) {
  // The reader module exports what the core calls (src/lazy.ts Reader), nothing else.
  const from = { stdin: { contents: `export { open, read, summary } from "./${basename(entry)}";`,
    resolveDir: dirname(entry), loader: "ts" } };
  const out = await build({
    ...(reader ? from : { entryPoints: [entry] }),
    bundle: true, write: false, format: reader ? "esm" : "iife",
    target: ["es2020"], minify: true, legalComments: "none",
    mangleProps: reader ? undefined : new RegExp(`^(${INTERNAL_PROPS.join("|")})$`),
    // Sloppy mode (no "use strict" prologue): nothing in the probe depends on strict semantics.
    tsconfigRaw: { compilerOptions: { alwaysStrict: false, strict: false } },
  });
  // A second pass with terser: ~4% smaller than esbuild alone.
  const min = await minify(out.outputFiles[0].text, {
    ecma: 2020, toplevel: true, module: reader, compress: { passes: 3, pure_getters: true },
    mangle: true, format: { comments: false },
  });
  return min.code ?? "";
}

/** gzip -9 as zlib does it (sizes.mjs's figures). */
export const gzipBytes = (code) => gzipSync(code, { level: 9 }).length;

/** What `gzip -9 -c file | wc -c` says (the gzip(1) tool stores the file's name and deflates
 *  on its own: 15–25 B more than zlib here), or null without the tool. */
export function gzipCliBytes(file) {
  try {
    return execFileSync("gzip", ["-9", "-c", file], { maxBuffer: 1 << 24 }).length;
  } catch {
    return null;
  }
}
