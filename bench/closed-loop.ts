/**
 * A closed loop of in-process callers measured over one window: the core of
 * the suite's engine side (bench/suite/engine.ts). Each of `clients` callers
 * makes its next call when its last one settles; after `warmupMs` the window
 * opens for `durationMs`, and only the calls answered inside it count. The process's
 * CPU (process.cpuUsage: the callers and every thread they drive) and the
 * caller's own counters (`snapshot`, read as the window opens and closes)
 * cover the same window.
 */
import { performance } from 'node:perf_hooks';
import type { Histogram } from 'hdr-histogram-js';
import { newHistogram } from './load.js';

export interface ClosedLoopSpec<S> {
  clients: number;
  warmupMs: number;
  durationMs: number;
  /** The n-th call of the loop (n counts from 0 over all callers, in the order they start). */
  call: (n: number) => Promise<unknown>;
  /** Told of each call answered inside the window. */
  counted?: (n: number) => void;
  /** The caller's counters (an engine's stats), read as the window opens and as it closes. */
  snapshot: () => S;
}

export interface ClosedLoopWindow<S> {
  /** Latency of the calls answered inside the window, µs (the caller destroys it). */
  histogram: Histogram;
  /** Calls answered inside the window. */
  requests: number;
  /** Calls that failed, warm-up and window alike; the first one's message. */
  errors: number;
  firstError: string | undefined;
  windowMs: number;
  /** This process's CPU over the window, ms. */
  cpuMs: number;
  before: S;
  after: S;
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

export async function runClosedLoop<S>(spec: ClosedLoopSpec<S>): Promise<ClosedLoopWindow<S>> {
  const histogram = newHistogram();
  let requests = 0;
  let errors = 0;
  let firstError: string | undefined;
  let next = 0;
  let stop = false;
  let window = { from: Infinity, to: Infinity };
  const caller = async () => {
    while (!stop) {
      const n = next++;
      const t0 = performance.now();
      try {
        await spec.call(n);
      } catch (err) {
        errors++;
        firstError ??= (err as Error).message ?? String(err);
        await new Promise((r) => setImmediate(r)); // a call failing at once must not starve the window's timers
        continue;
      }
      const t1 = performance.now();
      if (t1 < window.from || t1 >= window.to) continue;
      histogram.recordValue(Math.max(1, Math.round((t1 - t0) * 1000)));
      requests++;
      spec.counted?.(n);
    }
  };
  const callers = Array.from({ length: spec.clients }, caller);
  await sleep(spec.warmupMs);
  const before = spec.snapshot();
  const cpu0 = process.cpuUsage();
  window = { from: performance.now(), to: Infinity };
  await sleep(spec.durationMs);
  window = { from: window.from, to: performance.now() };
  const cpu = process.cpuUsage(cpu0);
  const after = spec.snapshot();
  stop = true;
  await Promise.all(callers);
  return { histogram, requests, errors, firstError, windowMs: window.to - window.from, cpuMs: (cpu.user + cpu.system) / 1000, before, after };
}
