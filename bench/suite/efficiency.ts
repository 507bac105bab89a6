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
import type { InferenceSession } from 'onnxruntime-node';
import type { CaseName, PhaseResult } from '../suite-results.js';
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
  );
}

/** One closed loop of raw batches of `size` on `session`, recorded as `label` (a batch counts as a request). */
export async function runRawPhase(ctx: SuiteContext, m: ModelSetup, c: CaseName, session: InferenceSession, size: number, label: string, round = 1): Promise<PhaseResult> {
  const { warmupMs, durationMs, seed } = ctx.options;
  const totalS = (warmupMs + durationMs) / 1000;
  ctx.progress.start(`${c} ${m.name} ${label}`, totalS);
  const h = newHistogram();
  const seqs = m.workloads.get('short')!.requests.map((q) => q[0]!);
  const batches = rawBatches(seqs, defaultBuckets(m.spec.maxLength), size, m.prepared, mulberry32(seed + size));
  const res = await runRawLoop(session, batches, warmupMs, durationMs, h);
  const p = phaseFromRaw(closedLoopMeta(c, m.name, 'short', label, 'in-process', round, size), res, h);
  ctx.phases.push(p);
  ctx.progress.finish(`${c} ${m.name} ${label}`, totalS, `${p.inputsPerS.toFixed(0)} inputs/s, ${p.latencyMs.p50.toFixed(2)} ms per batch`);
  return p;
}

/** One closed loop of raw batches per batch size. */
async function runRawPhases(ctx: SuiteContext, m: ModelSetup, first: boolean): Promise<PhaseResult[]> {
  const session = await openRawSession(m.prepared, ctx.options.device, 0);
  const raws: PhaseResult[] = [];
  try {
    for (const size of RAW_BATCH_SIZES) raws.push(await runRawPhase(ctx, m, first ? 'efficiency' : 'models', session, size, `raw onnxruntime b=${size}`));
  } finally {
    await session.release();
  }
  return raws;
}
