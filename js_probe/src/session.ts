// Per-session sampling: the decision is taken once per browser session and kept in
// localStorage, so a sampled user's requests are all traced (a journey, not a scatter), and
// a new session (new id, new draw) starts after `idleMs` without requests.
import { newSpanId } from "./traceContext";

export interface Session {
  id: string;
  sampled: boolean;
  last: number; // Date.now() of the last request
}

const KEY = "parallax.session";
let mem: Session | undefined;

function load(): Session | undefined {
  try {
    const s = JSON.parse(localStorage.getItem(KEY) || "null") as Session | null;
    if (s && typeof s.id === "string" && /^[A-Za-z0-9_-]{8,64}$/.test(s.id)) return s;
  } catch {
    // no storage (privacy mode, sandboxed iframe): the session lives as long as the page
  }
  return mem;
}

/** The current session, rotated when idle longer than `idleMs`; touches it. */
export function session(sampleRate: number, idleMs: number, t = Date.now()): Session {
  let s = load();
  let write = !s || t - s.last > 5000; // localStorage writes are synchronous: not every request
  if (!s || t - s.last > idleMs || t < s.last - idleMs) {
    s = { id: newSpanId() + newSpanId(), sampled: Math.random() < sampleRate, last: t };
    write = true;
  }
  mem = s;
  if (write) {
    s.last = t;
    try {
      localStorage.setItem(KEY, JSON.stringify(s));
    } catch {
      // see load()
    }
  }
  return s;
}

/** Tests: forget the in-memory copy. */
export const resetSession = (): void => {
  mem = undefined;
};
