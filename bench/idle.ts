/**
 * What a server costs doing nothing: `slabserve serve` as users start it (the
 * default models, the result cache on, gRPC on), left alone from --wait-s
 * after its `ready at` line for --window-s, each thread's CPU read from
 * /proc/PID/task/TID/schedstat at both ends; one server per round, one after
 * the other. Prints each round's total in % of one core and the threads that
 * spent it, then the median (the target: under 0.1% from 10 s after
 * ready; src/shared/gc.ts says where it went before).
 *
 *   node dist/bench/idle.js [--rounds 3] [--wait-s 10] [--window-s 30] [--args "--model tiny-embed"]
 *                           [--compare-cli ../before/dist/src/cli.js]
 */
import { readdirSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import { parseOptions } from './args.js';
import { machineLine } from './machine.js';
import { startServerProcess } from './server-process.js';
import { median } from './suite/phases.js';

const SPEC = {
  rounds: { type: 'int', min: 1, default: 3, help: 'servers, one after the other' },
  'wait-s': { type: 'number', min: 0, default: 10, help: 'seconds after ready before the window opens' },
  'window-s': { type: 'number', min: 1, default: 30, help: 'seconds the CPU is counted over' },
  args: { type: 'string', default: '', help: 'more `serve` flags, space-separated' },
  'compare-cli': { type: 'string', default: '', help: "another build's dist/src/cli.js: its servers alternate with this build's, round by round" },
} as const;

/** CPU ns of each thread of `pid` now, by thread id, with its name. */
function threadCpu(pid: number): Map<number, { name: string; ns: number }> {
  const out = new Map<number, { name: string; ns: number }>();
  for (const tid of readdirSync(`/proc/${pid}/task`).map(Number)) {
    try {
      const name = readFileSync(`/proc/${pid}/task/${tid}/comm`, 'latin1').trimEnd();
      const ns = Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'latin1').split(' ')[0]);
      out.set(tid, { name, ns });
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

/** A port nothing listens on now (for gRPC, which --port 0 would otherwise give one of its own). */
async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve));
  const port = (s.address() as { port: number }).port;
  await new Promise((resolve) => s.close(resolve));
  return port;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** One server of `cliPath` left idle: % of a core over the window, and the threads that spent it. */
async function idleRound(cliPath: string, o: { waitS: number; windowS: number; extra: string[] }): Promise<{ percent: number; threads: string }> {
  // --cache-mb 64: the default (startServerProcess turns the cache off unless it is asked for).
  const args = ['--port', '0', '--grpc-port', String(await freePort()), '--cache-mb', '64', ...o.extra];
  const server = await startServerProcess({ cliPath, args });
  try {
    await sleep(o.waitS * 1000);
    const before = threadCpu(server.pid);
    await sleep(o.windowS * 1000);
    const after = threadCpu(server.pid);
    const byName = new Map<string, number>();
    let total = 0;
    for (const [tid, { name, ns }] of after) {
      const spent = ns - (before.get(tid)?.ns ?? 0);
      total += spent;
      byName.set(name, (byName.get(name) ?? 0) + spent);
    }
    const threads = [...byName].filter(([, ns]) => ns > 0).sort((a, b) => b[1] - a[1]);
    return { percent: (total / 1e9 / o.windowS) * 100, threads: threads.map(([n, ns]) => `${n} ${(ns / 1e6).toFixed(1)} ms`).join(', ') };
  } finally {
    await server.stop();
  }
}

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/idle.js [options]', SPEC);
  const builds = [{ label: 'this build', cli: fileURLToPath(new URL('../src/cli.js', import.meta.url)) }];
  if (o['compare-cli']) builds.push({ label: o['compare-cli'], cli: o['compare-cli'] });
  const round = { waitS: o['wait-s'], windowS: o['window-s'], extra: o.args.split(' ').filter(Boolean) };
  console.log(machineLine());
  const totals = builds.map(() => [] as number[]);
  for (let r = 1; r <= o.rounds; r++) {
    for (const [i, b] of builds.entries()) {
      const { percent, threads } = await idleRound(b.cli, round);
      totals[i]!.push(percent);
      console.log(`round ${r}, ${b.label}: ${percent.toFixed(3)}% of a core; ${threads}`);
    }
  }
  for (const [i, b] of builds.entries()) {
    const t = totals[i]!;
    console.log(`${b.label}: idle from ${o['wait-s']} s after ready, over ${o['window-s']} s: median ${median(t).toFixed(3)}% of a core (rounds ${t.map((x) => x.toFixed(3)).join(', ')})`);
  }
}

await main();
