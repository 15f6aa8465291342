// The <script> build: `window.Parallax`. A plain object rather than esbuild's globalName
// namespace, which costs ~300 bytes of module helpers. The token reader is the module next to
// this script (import() resolves against the script's own URL), or Options.llmReader.
import { flush, markRendered, start, version } from "./probe";

const w = globalThis as typeof globalThis & { Parallax?: unknown };
w.Parallax = w.Parallax || {
  init: start, // (its default loader: see above)
  markRendered,
  flush,
  version,
};
