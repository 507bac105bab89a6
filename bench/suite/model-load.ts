/**
 * model-load: what loading a model while serving costs the model already
 * served. The first model under 8 HTTP clients in a server of
 * `--model-control-mode explicit`, rounds alternating a quiet window with one
 * in which a larger model loads (POST /v2/repository/models/M/load); then
 * load/unload cycles and the process's RSS before and after.
 */
import { readFileSync } from 'node:fs';
import { getText } from '../server-process.js';
import type { SuiteContext } from './context.js';
import { closedLoopMeta, median } from './phases.js';
import { benchModels } from './setup.js';

const LOADED = ['minilm-l6', 'bert-base'];
const CLIENTS = 8;
const mib = (b: number) => (b / 2 ** 20).toFixed(0);
const rss = (pid: number) => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) * 1024;

async function repository(origin: string, op: 'load' | 'unload', model: string): Promise<number> {
  const t0 = performance.now();
  const r = await fetch(`${origin}/v2/repository/models/${model}/${op}`, { method: 'POST' });
  if (r.status !== 200) throw new Error(`${op} ${model}: ${r.status} ${await r.text()}`);
  return performance.now() - t0;
}

export async function runModelLoad(ctx: SuiteContext): Promise<void> {
  if (!ctx.options.cases.has('model-load')) return;
  const m = ctx.models[0]!;
  const w = m.workloads.get('short')!;
  const dir = benchModels(ctx.options, [m.name, ...LOADED]);
  const t = await ctx.startSlabserve('slabserve', { ...m, dir }, ['--model-control-mode', 'explicit']);
  const pid = t.server.pid;
  try {
    for (const model of LOADED) {
      const loadMs: number[] = [];
      let footprint = '';
      const res = await ctx.ab(async (s, k) => {
        const meta = closedLoopMeta('model-load', m.name, w.name, s ? `while ${model} loads` : 'quiet', 'http', k, CLIENTS);
        // the load starts as the window opens
        const loading = s ? new Promise((r) => setTimeout(r, ctx.options.warmupMs)).then(() => repository(t.origin, 'load', model)) : undefined;
        const p = await ctx.load(meta, t, w, { kind: 'closed', concurrency: CLIENTS });
        if (loading) {
          loadMs.push(await loading);
          const bytes = new RegExp(`slabserve_model_memory_bytes\\{model="${model}"\\} (\\d+)`).exec(await getText(`${t.origin}/metrics`))?.[1];
          footprint = `footprint ${mib(Number(bytes))} MiB, process RSS ${mib(rss(pid))} MiB with it`;
          await repository(t.origin, 'unload', model);
        }
        return p;
      }, 2);
      const c = { id: `model-load/${m.name}/${model}`, case: 'model-load', question: `${m.name}'s P99 while a model loads`, model: m.name, workload: w.name, transport: 'http', metric: 'p99' } as const;
      ctx.compare({ ...c, note: `loading ${model}` }, { label: `while ${model} loads`, phases: res[1]! }, { label: 'quiet', phases: res[0]! });
      ctx.note('model-load', `${model}: loads in ${(median(loadMs) / 1000).toFixed(2)} s (median); ${footprint}`);
    }
    const cycles = ctx.options.quick ? 5 : 50;
    const before = rss(pid);
    for (let i = 0; i < cycles; i++) for (const op of ['load', 'unload'] as const) await repository(t.origin, op, LOADED[0]!);
    ctx.note('model-load', `${cycles} load/unload cycles of ${LOADED[0]}: RSS ${mib(before)} -> ${mib(rss(pid))} MiB (${(((rss(pid) - before) / before) * 100).toFixed(1)}%)`);
  } finally {
    await t.stop();
  }
}
