/**
 * Which kernel thread is which, and how much CPU each has used: what an
 * operator (and the bench) needs to see which thread of the process is
 * saturated. Linux only (/proc); elsewhere every answer is null or empty.
 *
 * Node names every thread "node", so each of our threads reports its own id
 * (/proc/thread-self) to the main thread, which labels the rest "other"
 * (V8's GC and compiler helpers, libuv's pool, onnxruntime's intra-op pool).
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';

/** The calling thread's kernel thread id, or null where /proc/thread-self is missing. */
export function currentThreadId(): number | null {
  try {
    const link = readlinkSync('/proc/thread-self'); // "<pid>/task/<tid>"
    const tid = Number(link.slice(link.lastIndexOf('/') + 1));
    return Number.isInteger(tid) ? tid : null;
  } catch {
    return null;
  }
}

/** Every thread id of this process (empty where /proc is missing). */
export function processThreadIds(pid: number | 'self' = 'self'): number[] {
  try {
    return readdirSync(`/proc/${pid}/task`).map(Number);
  } catch {
    return [];
  }
}

/**
 * Nanoseconds thread `tid` of process `pid` has run on a CPU
 * (/proc/PID/task/TID/schedstat, first field: finer than stat's clock ticks),
 * or null when it has exited or /proc is missing.
 */
export function threadCpuNs(tid: number, pid: number | 'self' = 'self'): number | null {
  try {
    const text = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'latin1');
    return Number(text.slice(0, text.indexOf(' ')));
  } catch {
    return null;
  }
}

/** CPU seconds per named thread of this process; every thread not named is summed under "other". */
export function threadCpuSeconds(named: ReadonlyMap<number, string>): Map<string, number> {
  const out = new Map<string, number>();
  for (const tid of processThreadIds()) {
    const ns = threadCpuNs(tid);
    if (ns === null) continue;
    const name = named.get(tid) ?? 'other';
    out.set(name, (out.get(name) ?? 0) + ns / 1e9);
  }
  return out;
}
