// Page clock. Every beacon time is ms (0.1 ms steps, what Chromium exposes without
// cross-origin isolation) from performance.timeOrigin. performance.now() is monotonic and
// stops while the machine sleeps, Date.now() does not: their difference is the drift the
// collector needs to map page times to wall-clock time after a sleep/resume.

/** Round to 0.1 ms: finer digits are timer noise and cost beacon bytes. */
export const r1 = (x: number): number => Math.round(x * 10) / 10;

export const now = (): number => r1(performance.now());

/** Date.now() − (timeOrigin + performance.now()): how far the page clock has drifted. */
export const drift = (): number => r1(Date.now() - (performance.timeOrigin + performance.now()));
