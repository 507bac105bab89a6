/**
 * cache: what the result cache buys and costs. `--cache-mb 0` against the
 * cache on, the same HTTP closed loops in alternating rounds, on a few hundred
 * texts sent over and over (every request a hit after the first pass) and on
 * texts that never repeat (every request a miss: the lookup's and the store's
 * cost). First model.
 */
import { getText } from '../server-process.js';
import { makeWorkload } from '../workloads.js';
import type { SuiteContext } from './context.js';
import { round } from './phases.js';

const CLIENTS = [1, 64];

/** The cache's hits and misses so far, all models. */
async function lookups(origin: string): Promise<{ hits: number; misses: number }> {
  const text = await getText(`${origin}/metrics`);
  const sum = (name: string) => text.split('\n').filter((l) => l.startsWith(name)).reduce((a, l) => a + Number(l.split(/\s+/).pop()), 0);
  return { hits: sum('slabserve_cache_hits_total'), misses: sum('slabserve_cache_misses_total') };
}

export async function runCache(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('cache')) return;
  const m = ctx.models[0]!;
  // more distinct texts than a run sends, so none is seen twice
  const workloads = [
    { ...(await makeWorkload('short', m.spec, ctx.options.seed, 512)), name: 'repeated' },
    { ...(await makeWorkload('short', m.spec, ctx.options.seed + 1, ctx.options.quick ? 30_000 : 150_000)), name: 'distinct' },
  ];
  const off = await ctx.startSlabserve('cache off', m, ['--cache-mb', '0']);
  const on = await ctx.startSlabserve('cache 64 MiB', m, ['--cache-mb', '64']);
  try {
    for (const w of workloads) {
      const before = await lookups(on.origin);
      for (const clients of CLIENTS) {
        const [a, b] = await ctx.closedRounds('cache', m.name, [on, off], 'http', w, clients);
        const c = { id: `cache/${m.name}/${w.name}/${clients}`, case: 'cache', question: 'What does the result cache buy?', model: m.name, workload: w.name, transport: 'http', metric: 'rps' } as const;
        ctx.compare({ ...c, note: `${clients} client${clients > 1 ? 's' : ''}, closed loop` }, { label: on.label, phases: a! }, { label: off.label, phases: b! });
      }
      const after = await lookups(on.origin);
      const hits = after.hits - before.hits;
      ctx.note('cache', `${w.name}: ${round((100 * hits) / (hits + after.misses - before.misses), 1)}% of the cache side's lookups were hits`);
    }
  } finally {
    await Promise.allSettled([on.stop(), off.stop()]);
  }
}
