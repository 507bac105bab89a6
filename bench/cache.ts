/**
 * What the result cache buys and costs (docs/cache.md has the method and the
 * results): `slabserve serve` with `--cache-mb 0` against the cache on, the same
 * closed-loop HTTP load in alternating rounds, on a few hundred texts sent over
 * and over (every request a hit after the first pass) and on texts that never
 * repeat (every request a miss: the lookup's and the store's cost).
 *
 *   node dist/bench/cache.js [--rounds 3] [--duration-s 3] [--clients 1,64]
 */
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadModelSpec } from '../src/shared/model-format/model-config.js';
import { mulberry32 } from '../models/generator/rng.js';
import { parseOptions } from './args.js';
import { runLoad } from './load.js';
import { machineLine } from './machine.js';
import { getText, startServerProcess, type ServerProcess } from './server-process.js';
import { alignedTable, fmt } from './table.js';
import { median, roundOrder } from './suite/phases.js';
import { makeWorkload, type Workload } from './workloads.js';

const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

const OPTIONS = {
  model: { type: 'string', value: 'NAME', default: 'tiny-embed', help: 'model folder under --models-dir' },
  'models-dir': { type: 'string', value: 'DIR', default: join(repoRoot, 'models'), help: 'where the models are' },
  'cache-mb': { type: 'int', min: 1, default: 64, help: 'the cache side\'s --cache-mb' },
  rounds: { type: 'int', min: 1, default: 3, help: 'rounds, alternating the two servers' },
  'duration-s': { type: 'number', min: 0.2, value: 'S', default: 3, help: 'measured seconds per phase' },
  'warmup-s': { type: 'number', min: 0, value: 'S', default: 0.5, help: 'warm-up seconds per phase' },
  clients: { type: 'ints', min: 1, default: [1, 64], help: 'closed-loop HTTP clients' },
  repeated: { type: 'int', min: 1, default: 512, help: 'distinct texts of the repeated workload' },
  distinct: { type: 'int', min: 1000, default: 150_000, help: 'texts of the distinct workload (more than a run sends)' },
} as const;

type Side = 'off' | 'on';
const SIDES: Side[] = ['off', 'on'];

interface Phase {
  reqPerS: number;
  p50Ms: number;
  serverUsPerReq: number;
  /** The load generator's CPU per request (wrk's where installed: bench/load.ts). */
  clientUsPerReq: number;
}

async function phase(server: ServerProcess, model: string, w: Workload, clients: number, o: { warmupMs: number; durationMs: number }, seed: number): Promise<Phase> {
  const r = await runLoad({ target: server, model, transport: 'http', workload: w, arrivals: { kind: 'closed', concurrency: clients }, warmupMs: o.warmupMs, durationMs: o.durationMs }, mulberry32(seed));
  try {
    if (r.errors + r.rejected > 0) console.error(`  ${r.errors + r.rejected} requests failed: ${r.firstError ?? 'refused'}`);
    return { reqPerS: (r.requests / r.windowMs) * 1000, p50Ms: r.histogram.getValueAtPercentile(50) / 1000, serverUsPerReq: ((r.serverCpuMs ?? NaN) * 1000) / r.requests, clientUsPerReq: (r.clientCpuMs * 1000) / r.requests };
  } finally {
    r.histogram.destroy();
  }
}

/** Hits over lookups on the cache side so far. */
async function hitShare(server: ServerProcess): Promise<{ hits: number; misses: number }> {
  const text = await getText(`${server.origin}/metrics`);
  const sum = (name: string) => text.split('\n').filter((l) => l.startsWith(name)).reduce((a, l) => a + Number(l.split(/\s+/).pop()), 0);
  return { hits: sum('slabserve_cache_hits_total'), misses: sum('slabserve_cache_misses_total') };
}

async function main(): Promise<void> {
  const o = parseOptions('node dist/bench/cache.js [options]', OPTIONS);
  const spec = loadModelSpec(join(o['models-dir'], o.model), o.model);
  console.log(`slabserve cache bench: ${o.model}, --cache-mb 0 against --cache-mb ${o['cache-mb']}, HTTP POST /embed one text, ${o.rounds} rounds alternating`);
  console.log(machineLine());
  const base = ['--host', '127.0.0.1', '--port', '0', '--models-dir', o['models-dir'], '--model', o.model, '--device', 'cpu'];
  const cli = join(repoRoot, 'dist', 'src', 'cli.js');
  const servers: Record<Side, ServerProcess> = {
    off: await startServerProcess({ cliPath: cli, args: [...base, '--cache-mb', '0'] }),
    on: await startServerProcess({ cliPath: cli, args: [...base, '--cache-mb', String(o['cache-mb'])] }),
  };
  // The suite's short texts (8..32 tokens from the vocabulary's words): practically never the same twice.
  const workloads = { repeated: await makeWorkload('short', spec, 1, o.repeated), distinct: await makeWorkload('short', spec, 2, o.distinct) };
  const times = { warmupMs: o['warmup-s'] * 1000, durationMs: o['duration-s'] * 1000 };
  const rows: string[][] = [];
  try {
    for (const [name, w] of Object.entries(workloads)) {
      const before = await hitShare(servers.on);
      for (const clients of o.clients) {
        const got: Record<Side, Phase[]> = { off: [], on: [] };
        for (let round = 0; round < o.rounds; round++) {
          // Both sides start at the same place in the workload in a round; every phase at a new one (the distinct texts stay unseen).
          const seed = 1000 * clients + round;
          for (const side of roundOrder(round + 1, SIDES.length).map((i) => SIDES[i]!)) got[side].push(await phase(servers[side], o.model, w, clients, times, seed));
        }
        const m = (side: Side, k: keyof Phase) => median(got[side].map((p) => p[k]));
        const byRound = got.on.map((p, i) => fmt(p.reqPerS / got.off[i]!.reqPerS, 2)).join(' ');
        rows.push([name, String(clients), fmt(m('off', 'reqPerS'), 0), fmt(m('on', 'reqPerS'), 0), `${fmt(m('on', 'reqPerS') / m('off', 'reqPerS'), 2)}x`, byRound, fmt(m('off', 'p50Ms'), 2), fmt(m('on', 'p50Ms'), 2), fmt(m('off', 'serverUsPerReq'), 0), fmt(m('on', 'serverUsPerReq'), 0), fmt(m('on', 'clientUsPerReq'), 0)]);
      }
      const after = await hitShare(servers.on);
      const hits = after.hits - before.hits;
      rows[rows.length - 1]!.push(`${fmt((100 * hits) / (hits + after.misses - before.misses), 1)}%`);
    }
  } finally {
    await Promise.all(Object.values(servers).map((s) => s.stop()));
  }
  const headers = ['workload', 'clients', 'off req/s', 'on req/s', 'on / off', 'by round', 'off P50 ms', 'on P50 ms', 'off server us/req', 'on server us/req', 'load gen. us/req (on)', 'hit share'];
  console.log(alignedTable(headers, rows.map((r) => (r.length < headers.length ? [...r, ''] : r)), 2));
  console.log('hit share: hits / lookups on the cache side over all of that workload\'s phases (shown on its last row)');
}

await main();
