/**
 * defaults: which maxInflightBatches and intraOpThreads the engine should
 * default to. In-process engines (createEngine, CLIENTS callers of
 * engine.embed(text) on the short workload, batching on) with 1 and 2
 * batches in flight at each intra-op thread count (0: the engine's own
 * choice, src/gpu-worker/intra-op-threads.ts; then 1 and 2), beside raw
 * onnxruntime at b = 32 with the same thread counts (what each count gives
 * the model alone), all in the same alternating rounds. Each engine against
 * the shipped default. First model only; the only case no server runs in.
 */
import { ENGINE_DEFAULTS } from '../../src/main/engine.js';
import { openRawSession } from '../raw-ort.js';
import type { PhaseResult } from '../suite-results.js';
import { CLIENTS, type SuiteContext } from './context.js';
import { runRawPhase } from './efficiency.js';
import type { EngineSide } from './engine.js';
import { closedLoopMeta } from './phases.js';
import type { ModelSetup } from './setup.js';

export const DEFAULTS_INTRA = [0, 1, 2];
const INFLIGHT = [1, 2];
const RAW_BATCH = 32;

export async function runDefaults(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<void> {
  if (!first || !ctx.options.cases.has('defaults')) return;
  const w = m.workloads.get('short')!;
  const engines: EngineSide[] = [];
  const raws: { intra: number; session: Awaited<ReturnType<typeof openRawSession>> }[] = [];
  try {
    for (const intraOpThreads of DEFAULTS_INTRA) {
      for (const maxInflightBatches of INFLIGHT) engines.push(await ctx.openEngine(`engine inflight=${maxInflightBatches} intra=${intraOpThreads}`, m, { maxInflightBatches, intraOpThreads }));
      raws.push({ intra: intraOpThreads, session: await openRawSession(m.prepared, ctx.options.device, intraOpThreads) });
    }
    const phases: PhaseResult[][] = await ctx.ab((s, k) => {
      if (s < engines.length) return ctx.engineLoad(closedLoopMeta('defaults', m.name, w.name, engines[s]!.label, 'in-process', k, CLIENTS), engines[s]!, w, CLIENTS);
      const r = raws[s - engines.length]!;
      return runRawPhase(ctx, m, 'defaults', r.session, RAW_BATCH, `raw onnxruntime b=${RAW_BATCH} intra=${r.intra}`, k);
    }, engines.length + raws.length);
    const def = engines.findIndex((e) => e.label === `engine inflight=${ENGINE_DEFAULTS.maxInflightBatches} intra=0`);
    for (const [i, e] of engines.entries()) {
      if (i === def) continue;
      ctx.compare(
        { id: `defaults/${m.name}/${e.label.replace(/\s+/g, '-')}`, case: 'defaults', question: `${e.label.replace('engine ', '')} against the default?`, model: m.name, workload: w.name, transport: 'in-process', metric: 'rps', note: `${CLIENTS} in-process callers of engine.embed(text), batching on` },
        { label: e.label, phases: phases[i]! },
        { label: `${engines[def]!.label} (default)`, phases: phases[def]! },
      );
    }
  } finally {
    for (const e of engines) await e.engine.close();
    for (const r of raws) await r.session.release();
  }
}
