/**
 * Doorbell.pollUntil, the inference loop's busy poll after a batch
 * (--busy-poll-us): it must see a ring from another thread while it polls,
 * give up at its deadline, and not poll at all once the deadline has passed.
 */
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { nowMs } from '../dist/src/shared/clock.js';
import { Doorbell } from '../dist/src/shared/doorbell.js';

const cells = () => new Int32Array(new SharedArrayBuffer(8));

describe('Doorbell.pollUntil', () => {
  it('returns true as soon as another thread rings during the poll', async () => {
    const a = cells();
    const bell = new Doorbell(a, 1);
    const seen = bell.read();
    // The other thread rings 20 ms after it starts; this one polls for up to 10 s (the bound only catches a hang).
    const ringer = new Worker(
      `const { workerData } = require('node:worker_threads');
       const a = new Int32Array(workerData);
       Atomics.wait(a, 0, 0, 20);
       Atomics.add(a, 1, 1); Atomics.notify(a, 1);`,
      { eval: true, workerData: a.buffer },
    );
    await new Promise((r) => ringer.once('online', r));
    const started = nowMs();
    expect(bell.pollUntil(seen, started + 10_000)).toBe(true);
    expect(bell.read()).toBe(seen + 1);
    expect(nowMs() - started).toBeLessThan(10_000);
    await ringer.terminate();
  });

  it('returns false at its deadline when nobody rings, and at once when the deadline has passed', () => {
    const bell = new Doorbell(cells(), 0);
    const seen = bell.read();
    const started = nowMs();
    expect(bell.pollUntil(seen, started + 5)).toBe(false);
    expect(nowMs() - started).toBeGreaterThanOrEqual(5);
    expect(bell.pollUntil(seen, -Infinity)).toBe(false);
  });

  it('returns true at once for a ring that came before the poll', () => {
    const bell = new Doorbell(cells(), 0);
    const seen = bell.read();
    bell.ring();
    expect(bell.pollUntil(seen, nowMs() + 10_000)).toBe(true);
  });
});
