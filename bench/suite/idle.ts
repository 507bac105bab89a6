/**
 * idle: what a server costs doing nothing. `slabserve serve` as users start it
 * (the repository's models, the result cache and gRPC on), left alone from 10 s
 * after ready for a window, each thread's CPU read from /proc at both ends; one
 * server per round. The target is under 0.1% of a core (src/shared/gc.ts says
 * where it went before).
 */
import { readFileSync } from 'node:fs';
import { processThreadIds, threadCpuNs } from '../../src/shared/threads.js';
import { startServerProcess } from '../server-process.js';
import type { SuiteContext } from './context.js';
import { CLI } from './paths.js';
import { median, round } from './phases.js';

const WAIT_S = 10;
const sleep = (s: number) => new Promise((r) => setTimeout(r, s * 1000));

/** CPU ns of each thread of `pid` now, by thread id, with its name. */
function threadCpu(pid: number): Map<number, { name: string; ns: number }> {
  const out = new Map<number, { name: string; ns: number }>();
  for (const tid of processThreadIds(pid)) {
    try {
      out.set(tid, { name: readFileSync(`/proc/${pid}/task/${tid}/comm`, 'latin1').trimEnd(), ns: threadCpuNs(tid, pid) ?? 0 });
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

export async function runIdle(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('idle')) return;
  const windowS = ctx.options.quick ? 5 : 30;
  const shares: number[] = [];
  for (let k = 1; k <= ctx.options.rounds; k++) {
    const server = await startServerProcess({ cliPath: CLI, args: ['--host', '127.0.0.1', '--port', '0', '--cache-mb', '64'] });
    try {
      await sleep(WAIT_S);
      const before = threadCpu(server.pid);
      await sleep(windowS);
      const byName = new Map<string, number>();
      for (const [tid, { name, ns }] of threadCpu(server.pid)) byName.set(name, (byName.get(name) ?? 0) + ns - (before.get(tid)?.ns ?? 0));
      const total = [...byName.values()].reduce((a, b) => a + b, 0);
      shares.push((total / 1e9 / windowS) * 100);
      const threads = [...byName].filter(([, ns]) => ns > 0).sort((a, b) => b[1] - a[1]);
      ctx.note('idle', `round ${k}: ${shares.at(-1)!.toFixed(3)}% of a core; ${threads.map(([n, ns]) => `${n} ${(ns / 1e6).toFixed(1)} ms`).join(', ')}`);
    } finally {
      await server.stop();
    }
  }
  ctx.note('idle', `from ${WAIT_S} s after ready, over ${windowS} s: median ${round(median(shares), 3)}% of a core`);
}
