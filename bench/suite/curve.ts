/**
 * curve: latency against throughput. Open-loop Poisson arrivals at --loads
 * (fractions of the batched server's capacity, from batching and a probe right
 * before), and bursts at 50% (full runs), for the defaults (dispatch when
 * idle), a fixed 10 ms window with 2 batches in flight (full runs), and
 * --slo-p99-ms. First model only. Latency counts from each request's
 * scheduled time (bench/load.ts).
 */
import type { Curve, PhaseResult } from '../suite-results.js';
import { CLIENTS, type SuiteContext } from './context.js';
import { closedLoopMeta, round } from './phases.js';
import type { ModelSetup } from './setup.js';
import type { Target } from './targets.js';

/** 4x the rate for 10% of every 500 ms (and less in between: the mean stays the offered rate). */
const BURSTS = { factor: 4, duty: 0.1, periodMs: 500 };

interface CurveConfig {
  label: string;
  extra: string[];
  slo?: number;
}

/** Runs the case for `m` from `batchedHttp` (batching's phases: without them there is no capacity to start from). */
export async function runCurves(ctx: SuiteContext, m: ModelSetup, first: boolean, batchedHttp: PhaseResult[]): Promise<void> {
  if (!first || !ctx.options.cases.has('curve') || batchedHttp.length === 0) return;
  const { quick, sloP99Ms } = ctx.options;
  // noise from other work on a shared machine only ever lowers throughput: the best round is the capacity
  let capacity = Math.max(...batchedHttp.map((p) => p.rps));
  const configs: CurveConfig[] = [
    { label: 'dispatch when idle (defaults)', extra: [] },
    ...(quick ? [] : [{ label: 'fixed window 10 ms, 2 in flight', extra: ['--max-batch-delay-ms', '10', '--max-inflight-batches', '2'] }]),
    { label: `--slo-p99-ms ${sloP99Ms}`, extra: ['--slo-p99-ms', String(sloP99Ms)], slo: sloP99Ms },
  ];
  for (const [ci, cfg] of configs.entries()) {
    const target = await ctx.startSlabserve(cfg.label, m, cfg.extra);
    if (ci === 0) {
      // one more closed-loop probe right before the curves, on the defaults' own server
      const meta = closedLoopMeta('curve', m.name, 'short', `${cfg.label} capacity probe`, 'http', 1, CLIENTS);
      const probe = await ctx.load(meta, target, m.workloads.get('short')!, { kind: 'closed', concurrency: CLIENTS });
      capacity = Math.max(capacity, probe.rps);
    }
    const curve: Curve = { id: `curve/${m.name}/${cfg.label.replace(/\s+/g, '-')}`, model: m.name, workload: 'short', transport: 'http', label: cfg.label, serverArgs: cfg.extra, capacityRps: round(capacity, 1), ...(cfg.slo ? { sloP99Ms: cfg.slo } : {}), points: [] };
    try {
      await runPoints(ctx, m, target, curve, capacity);
    } finally {
      await target.stop();
    }
    ctx.curves.push(curve);
  }
}

/** The curve's points, one open-loop phase each, added to `curve`. */
async function runPoints(ctx: SuiteContext, m: ModelSetup, target: Target, curve: Curve, capacity: number): Promise<void> {
  const points: { f: number; arrivals: 'poisson' | 'bursts' }[] = ctx.options.loadFractions.map((f) => ({ f, arrivals: 'poisson' as const }));
  if (!ctx.options.quick) points.push({ f: 0.5, arrivals: 'bursts' });
  for (const pt of points) {
    const offered = capacity * pt.f;
    const p = await ctx.load(
      { case: 'curve', model: m.name, workload: 'short', target: curve.label, transport: 'http', loop: 'open', round: 1, offeredRps: round(offered, 1), loadFraction: pt.f, arrivals: pt.arrivals },
      target,
      m.workloads.get('short')!,
      { kind: 'open', ratePerS: offered, ...(pt.arrivals === 'bursts' ? { bursts: BURSTS } : {}) },
      ctx.options.curvePointMs,
    );
    const offeredCount = p.requests + p.rejected + p.errors;
    curve.points.push({
      loadFraction: pt.f,
      arrivals: pt.arrivals,
      offeredRps: round(offered, 1),
      achievedRps: p.rps,
      p50: p.latencyMs.p50,
      p99: p.latencyMs.p99,
      rejectedShare: offeredCount > 0 ? round(p.rejected / offeredCount, 4) : 0,
      errors: p.errors,
      ...(p.server ? { meanBatch: p.server.meanBatch } : {}),
      phaseId: p.id,
    });
  }
}
