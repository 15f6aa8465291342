// The <script> build of the probe, shared by build.mjs (dist/parallax.min.js and its size
// budget) and sizes.mjs (what each feature costs).
import { build } from "esbuild";
import { minify } from "terser";
import { gzipSync } from "node:zlib";

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

/** The minified IIFE for `entry` (src/global.ts: window.Parallax, assigned by the module
 *  itself, which is smaller than esbuild's globalName namespace). */
export async function iife(entry = "src/global.ts") {
  const out = await build({
    entryPoints: [entry], bundle: true, write: false, format: "iife", target: ["es2020"],
    minify: true, legalComments: "none",
    mangleProps: new RegExp(`^(${INTERNAL_PROPS.join("|")})$`),
    // Sloppy mode (no "use strict" prologue): nothing in the probe depends on strict semantics.
    tsconfigRaw: { compilerOptions: { alwaysStrict: false, strict: false } },
  });
  // A second pass with terser: ~4% smaller than esbuild alone.
  const min = await minify(out.outputFiles[0].text, {
    ecma: 2020, toplevel: true, compress: { passes: 3, pure_getters: true },
    mangle: true, format: { comments: false },
  });
  return min.code ?? "";
}

/** What the size budget counts: gzip -9 as zlib does it (the gzip(1) CLI says ~25 B more). */
export const gzipBytes = (code) => gzipSync(code, { level: 9 }).length;
