/**
 * The measured window of a load phase: the client's CPU, the server's CPU and
 * (slabserve) its counters, taken at both ends.
 */
import { performance } from 'node:perf_hooks';
import type { ServerCounters } from './server-process.js';

const cpuMs = (u: NodeJS.CpuUsage) => (u.user + u.system) / 1000;

/** A server measured around a window: its CPU, and (slabserve) its counters. */
export interface MeasuredTarget {
  cpuMs(): number | null;
  counters?(model: string): Promise<ServerCounters>;
}

/** What a load loop measures around its window; the counters only where the server has them (slabserve). */
export interface WindowMeasures {
  windowMs: number;
  /** This process's CPU ms over the window. */
  clientCpuMs: number;
  /** Server process CPU ms over the window (null without /proc). */
  serverCpuMs: number | null;
  before?: ServerCounters;
  after?: ServerCounters;
  /** Ms between the midpoints of the two /metrics scrapes: the window the counter deltas cover. */
  countersMs: number;
}

/**
 * Opens a measured window now: scrapes the server's counters, then notes this
 * process's CPU, the server's CPU and the start time.
 * close() ends the window (`onEnd` is called at its end, before the second
 * scrape, so answers during the scrape do not count) and takes them again.
 */
export async function openWindow(
  target: MeasuredTarget,
  model: string,
): Promise<{ start: number; close(onEnd?: (end: number) => void): Promise<WindowMeasures> }> {
  const scrape = async () => {
    const t0 = performance.now();
    const c = target.counters ? await target.counters(model) : undefined;
    return { c, at: (t0 + performance.now()) / 2 };
  };
  const before = await scrape();
  const cpu0 = process.cpuUsage();
  const s0 = target.cpuMs();
  const start = performance.now();
  return {
    start,
    close: async (onEnd) => {
      const end = performance.now();
      onEnd?.(end);
      const s1 = target.cpuMs();
      const clientCpuMs = cpuMs(process.cpuUsage(cpu0));
      const after = await scrape();
      return {
        windowMs: end - start,
        clientCpuMs,
        serverCpuMs: s0 !== null && s1 !== null ? s1 - s0 : null,
        ...(before.c ? { before: before.c } : {}),
        ...(after.c ? { after: after.c } : {}),
        countersMs: after.at - before.at,
      };
    },
  };
}
