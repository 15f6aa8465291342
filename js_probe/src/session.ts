// Per-session sampling: the decision is taken once per browser session and kept in
// localStorage, so a sampled user's requests are all traced (a journey, not a scatter), and
// a new session (new id, new draw) starts after `idleMs` without requests.
import { randomHex } from "./traceContext";

export interface Session {
  id: string;
  sampled: boolean;
  last: number; // Date.now() of the last request
}

const KEY = "parallax.session";
let mem: Session | undefined;

/** The current session, rotated when idle longer than `idleMs`; touches it. */
export function session(sampleRate: number, idleMs: number, t = Date.now()): Session {
  let s = mem;
  try {
    const x = JSON.parse(localStorage.getItem(KEY)!) as Session; // null: throws below
    if (typeof x.id == "string" && /^[\w-]{8,64}$/.test(x.id)) s = x;
  } catch {
    // no storage (privacy mode, sandboxed iframe): the session lives as long as the page
  }
  if (!s || t - s.last > idleMs || t < s.last - idleMs)
    s = { id: randomHex(16), sampled: Math.random() < sampleRate, last: 0 }; // last 0: written now
  mem = s;
  // localStorage writes are synchronous: not on every request.
  if (t - s.last > 5000) {
    s.last = t;
    try {
      localStorage.setItem(KEY, JSON.stringify(s));
    } catch {
      // see above
    }
  }
  return s;
}

/** Tests: forget the in-memory copy. */
export const resetSession = (): void => {
  mem = undefined;
};
