// The <script> build: `window.Parallax`. A plain object rather than esbuild's globalName
// namespace, which costs ~300 bytes of module helpers.
import { flush, init, markRendered, version } from "./index";

const w = globalThis as typeof globalThis & { Parallax?: unknown };
w.Parallax = w.Parallax || { init, markRendered, flush, version };
