/**
 * The inference loop's idle spin (--idle-spin-us): it watches the bell,
 * returns the moment another thread rings it, and never returns early otherwise; the flag's range.
 */
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { spinFor } from '../dist/src/gpu-worker/inference-loop.js';
import { OPTIONS } from '../dist/src/shared/options.js';

const MAX_IDLE_SPIN_US = OPTIONS.idleSpinUs.max!;
import { Doorbell } from '../dist/src/shared/doorbell.js';
import { startServer } from '../dist/src/main/server.js';
import { expectCliRefuses } from './cli-process.js';
import { eventually, testServerConfig } from './helpers.js';

const bell = () => new Doorbell(new Int32Array(new SharedArrayBuffer(4)), 0);

describe('spinFor', () => {
  it('returns at once when the bell has rung since it was read, and at once for 0', () => {
    const b = bell();
    const seen = b.read();
    b.ring();
    const started = performance.now();
    spinFor(b, seen, 10_000_000); // 10 s: a hang, not a bound
    spinFor(bell(), 0, 0);
    expect(performance.now() - started).toBeLessThan(5_000);
  });

  it('without a ring, spins its whole budget', () => {
    const started = performance.now();
    spinFor(bell(), 0, 20_000);
    expect(performance.now() - started).toBeGreaterThanOrEqual(20);
  });

  it('stops when another thread rings the bell, long before its budget', async () => {
    const cells = new Int32Array(new SharedArrayBuffer(4));
    const b = new Doorbell(cells, 0);
    const seen = b.read();
    // The ringer waits to be told the spin has begun (cell 0 is the bell: it uses its own cell).
    const ready = new Int32Array(new SharedArrayBuffer(4));
    const ringer = new Worker(
      `const { workerData } = require('node:worker_threads');
       const ready = new Int32Array(workerData.ready);
       Atomics.wait(ready, 0, 0);
       const cells = new Int32Array(workerData.cells);
       Atomics.add(cells, 0, 1);
       Atomics.notify(cells, 0);`,
      { eval: true, workerData: { cells: cells.buffer, ready: ready.buffer } },
    );
    await new Promise((resolve) => ringer.once('online', resolve));
    Atomics.store(ready, 0, 1);
    Atomics.notify(ready, 0);
    spinFor(b, seen, 60_000_000); // a minute: returning at all is the ring's doing
    expect(b.read()).not.toBe(seen);
    await ringer.terminate();
  });
});

/** CPU seconds of the server's inference thread (slabserve_thread_cpu_seconds_total). */
async function inferenceCpu(port: number): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  return Number(text.split('\n').find((l) => l.startsWith('slabserve_thread_cpu_seconds_total{thread="inference"}'))!.split(' ').at(-1));
}

describe('--idle-spin-us', () => {
  it('the inference thread spins that long after a request before it sleeps', { timeout: 60_000 }, async () => {
    const server = await startServer(testServerConfig({ models: ['tiny-embed'], idleSpinUs: MAX_IDLE_SPIN_US }));
    try {
      await server.ready;
      const before = await inferenceCpu(server.port);
      const r = await fetch(`http://127.0.0.1:${server.port}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{"inputs":"spin after me"}' });
      expect(r.status).toBe(200);
      // One batch costs about a millisecond; the spin after it up to a second of CPU (less on a busy machine:
      // the spin is bounded by the clock, and this thread may share its core). Without a spin this never comes.
      const spent = await eventually('the spin after the request', async () => (await inferenceCpu(server.port)) - before, (cpu) => cpu > 0.1);
      expect(spent).toBeGreaterThan(0.1);
    } finally {
      await server.close();
    }
  });

  it('refuses a spin out of range: startServer, the flag and SLABSERVE_IDLE_SPIN_US', async () => {
    await expect(startServer(testServerConfig({ models: ['tiny-embed'], idleSpinUs: MAX_IDLE_SPIN_US + 1 }))).rejects.toThrow(/idleSpinUs must be an integer from 0 to 1000000, got 1000001/);
    expectCliRefuses(
      [
        [['--idle-spin-us', '1000001'], {}],
        [['--idle-spin-us', '-1'], {}],
        [[], { SLABSERVE_IDLE_SPIN_US: 'long' }],
      ],
      /--idle-spin-us .*expected an integer from 0 to 1000000/,
    );
  });
});
