// The <script> build: `window.Parallax`. A plain object rather than esbuild's globalName
// namespace, which costs ~300 bytes of module helpers. The token reader is the module next to
// this script (import() resolves against the script's own URL), or Options.llmReader.
import { from } from "./lazy";
import { flush, markRendered, start, version, type Options } from "./probe";

const w = globalThis as typeof globalThis & { Parallax?: unknown };
w.Parallax = w.Parallax || {
  init: (o: Options) => start(o, from("./parallax-llm.min.js")),
  markRendered,
  flush,
  version,
};
