/**
 * efficiency: how close the server gets to onnxruntime alone. Raw onnxruntime
 * in this process at b = 1, 8, 32 on the same token lengths (each batch from
 * one length bucket, padded to it: the scheduler's best case), the best kept,
 * against the batched server's 64-client HTTP phases from batching. For the
 * models after the first, recorded as the `models` case.
 */
import { defaultBuckets } from '../../src/gpu-worker/scheduler.js';
import { mulberry32 } from '../../models/generator/rng.js';
import { newHistogram } from '../load.js';
import { openRawSession, rawBatches, runRawLoop } from '../raw-ort.js';
import type { PhaseResult } from '../suite-results.js';
import { CLIENTS, type SuiteContext } from './context.js';
import { closedLoopMeta, phaseFromRaw } from './phases.js';
import type { ModelSetup } from './setup.js';

export const RAW_BATCH_SIZES = [1, 8, 32];

/** Runs the case for model `m` against `batchedHttp` (batching's phases; nothing to compare without them). */
export async function runEfficiency(ctx: SuiteContext, m: ModelSetup, first: boolean, batchedHttp: PhaseResult[]): Promise<void> {
  const cases = ctx.options.cases;
  if (!(cases.has('efficiency') || (cases.has('models') && !first)) || batchedHttp.length === 0) return;
  const raws = await runRawPhases(ctx, m, first);
  const best = raws.reduce((a, b) => (b.inputsPerS > a.inputsPerS ? b : a));
  ctx.compare(
    {
      id: `efficiency/${m.name}/http`,
      case: first ? 'efficiency' : 'models',
      question: 'How close is the server to onnxruntime alone?',
      model: m.name,
      workload: 'short',
      transport: 'http',
      metric: 'inputsPerS',
      note: `server over HTTP (${CLIENTS} clients, tokenizing) / raw onnxruntime in-process at its best batch (${best.target.replace('raw onnxruntime ', '')}), same token lengths`,
    },
    { label: 'slabserve HTTP', phases: batchedHttp },
    { label: best.target, phases: [best] },
    (p) => p.inputsPerS,
  );
}

/** One closed loop of raw batches per batch size, recorded (a batch counts as a request). */
async function runRawPhases(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<PhaseResult[]> {
  const { device, warmupMs, durationMs, seed } = ctx.options;
  const session = await openRawSession(m.prepared, device, 0);
  const raws: PhaseResult[] = [];
  try {
    const seqs = m.workloads.get('short')!.requests.map((q) => q[0]!);
    for (const size of RAW_BATCH_SIZES) {
      const label = `raw onnxruntime b=${size}`;
      const totalS = (warmupMs + durationMs) / 1000;
      ctx.progress.start(`efficiency ${m.name} ${label}`, totalS);
      const h = newHistogram();
      const batches = rawBatches(seqs, defaultBuckets(m.spec.maxLength), size, m.prepared, mulberry32(seed + size));
      const res = await runRawLoop(session, batches, warmupMs, durationMs, h);
      const p = phaseFromRaw(closedLoopMeta(first ? 'efficiency' : 'models', m.name, 'short', label, 'in-process', 1, size), res, h);
      ctx.phases.push(p);
      raws.push(p);
      ctx.progress.finish(`efficiency ${m.name} ${label}`, totalS, `${p.inputsPerS.toFixed(0)} inputs/s, ${p.latencyMs.p50.toFixed(2)} ms per batch`);
    }
  } finally {
    await session.release();
  }
  return raws;
}
