/**
 * Which kernel thread is which, and how much CPU each has used: what an
 * operator (and the bench) needs to see which thread of the process is
 * saturated. Linux only (/proc); elsewhere every answer is null or empty.
 *
 * Node names every thread "node", so each of our threads reports its own id
 * (/proc/thread-self) to the main thread, which labels the rest "other"
 * (V8's GC and compiler helpers, libuv's pool, the tokenizer pool). The
 * inference thread also names itself, and a thread inherits its creator's
 * name: that is how it tells onnxruntime's intra-op pool from the rest.
 */
import { readdirSync, readFileSync, readlinkSync, writeFileSync } from 'node:fs';
import { getPriority, setPriority } from 'node:os';

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

/** The kernel's name of thread `tid` of this process (/proc/self/task/TID/comm), or null. */
export function threadName(tid: number): string | null {
  try {
    return readFileSync(`/proc/self/task/${tid}/comm`, 'latin1').trimEnd();
  } catch {
    return null;
  }
}

/**
 * Names thread `tid` (the calling thread by default) for the kernel: what
 * `top -H`, `ps -L` and profilers show, and what a thread it starts inherits.
 * At most 15 bytes are kept. False where it cannot be done (no /proc).
 */
export function nameThread(name: string, tid: number | null = currentThreadId()): boolean {
  if (tid === null) return false;
  try {
    writeFileSync(`/proc/self/task/${tid}/comm`, name.slice(0, 15));
    return true;
  } catch {
    return false;
  }
}

/** The threads of this process the kernel calls `name` (comm, at most 15 bytes compared). */
export function threadsNamed(name: string): number[] {
  const want = name.slice(0, 15);
  return processThreadIds().filter((tid) => threadName(tid) === want);
}

/**
 * Gives each thread in `tids` at least the nice value `nice` (0-19: higher
 * runs later when the cores are contended; a thread already nicer keeps its
 * own, since raising a priority needs privileges). Linux only: there a thread
 * has its own nice value (setpriority on its thread id), where elsewhere the
 * same call would renice a whole process. A thread that has gone is skipped.
 * Returns the threads changed.
 */
export function lowerThreadPriority(tids: readonly number[], nice: number): number[] {
  if (process.platform !== 'linux') return [];
  const done: number[] = [];
  for (const tid of tids) {
    try {
      if (getPriority(tid) >= nice) continue;
      setPriority(tid, nice);
      done.push(tid);
    } catch {
      /* gone, or not permitted: left as it is */
    }
  }
  return done;
}

/**
 * Claims the threads a library started while the calling thread was named
 * `openingName` (a thread inherits its creator's name, and no other thread has
 * that one): names them `poolName`, gives them at least nice value `nice`
 * (0: left as they are), and names the calling thread `ownName`. Returns their ids.
 * onnxruntime's intra-op pool is found so (src/gpu-worker/thread.ts, session-thread.ts).
 */
export function claimThreadsStarted(openingName: string, ownName: string, poolName: string, nice: number): { own: number | null; pool: number[] } {
  const own = currentThreadId();
  const pool = threadsNamed(openingName).filter((t) => t !== own);
  nameThread(ownName, own);
  for (const t of pool) nameThread(poolName, t);
  if (nice > 0) lowerThreadPriority(pool, nice);
  return { own, pool };
}
