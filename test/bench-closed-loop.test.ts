/**
 * The benches' in-process closed loop (bench/closed-loop.ts): which calls its
 * window counts, read by the order of events (an answer before the window
 * opens or after it closes is never counted), not by how long anything took.
 */
import { describe, expect, it } from 'vitest';
import { runClosedLoop } from '../dist/bench/closed-loop.js';
import { makeRandom } from './helpers.js';

describe('runClosedLoop', () => {
  it('counts exactly the calls answered while the window is open, each caller waiting for its last call, failures apart', async () => {
    const r = makeRandom('closed loop');
    const events: string[] = [];
    let inFlight = 0;
    let mostInFlight = 0;
    const fails = (n: number) => n % 7 === 3;
    const loop = await runClosedLoop({
      clients: 4,
      warmupMs: 60,
      durationMs: 120,
      call: (n) => {
        inFlight++;
        mostInFlight = Math.max(mostInFlight, inFlight);
        // Settles after 1 to 4 turns of the event loop (no timer: only the order of events matters).
        const turns = 1 + Math.floor(r() * 4);
        return new Promise((resolve, reject) => {
          const settle = (left: number): void => {
            if (left > 1) return void setImmediate(settle, left - 1);
            inFlight--;
            events.push(`${fails(n) ? 'failed' : 'answered'} ${n}`);
            if (fails(n)) reject(new Error(`call ${n} refused`));
            else resolve(n);
          };
          setImmediate(settle, turns);
        });
      },
      counted: (n) => events.push(`counted ${n}`),
      snapshot: () => {
        events.push('snapshot');
        return events.length;
      },
    });
    try {
      const open = events.indexOf('snapshot');
      const close = events.lastIndexOf('snapshot');
      expect(open).toBeGreaterThan(0); // some calls were answered during the warm-up
      expect(close).toBeGreaterThan(open);
      expect(close).toBeLessThan(events.length - 1); // the callers in flight at the close settled after it
      const answeredInside = events.slice(open, close).filter((e) => e.startsWith('answered')).map((e) => Number(e.split(' ')[1]));
      const counted = events.filter((e) => e.startsWith('counted')).map((e) => Number(e.split(' ')[1]));
      expect(counted).toEqual(answeredInside);
      expect(counted.length).toBeGreaterThan(10);
      expect(loop.requests).toBe(counted.length);
      expect(loop.histogram.totalCount).toBe(counted.length);
      const failed = events.filter((e) => e.startsWith('failed')).length;
      expect(failed).toBeGreaterThan(0);
      expect(loop.errors).toBe(failed);
      expect(loop.firstError).toMatch(/^call \d+ refused$/);
      expect(mostInFlight).toBe(4);
      expect({ before: loop.before, after: loop.after }).toEqual({ before: open + 1, after: close + 1 });
      expect([Number.isFinite(loop.windowMs), Number.isFinite(loop.cpuMs)]).toEqual([true, true]); // the window closed, its CPU read
    } finally {
      loop.histogram.destroy();
    }
  });
});
