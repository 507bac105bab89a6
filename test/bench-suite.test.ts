/**
 * The suite's pure pieces (bench/suite/): its settings from the command line
 * (defaults, --quick defaults, the units the cases use), phase ids, the
 * server side of a window from two /metrics scrapes, and how two sides are
 * compared round by round, and the order the sides run in each round.
 */
import { describe, expect, it } from 'vitest';
import { parseSuiteOptions } from '../dist/bench/suite/options.js';
import hdr from 'hdr-histogram-js';
import { closedLoopMeta, comparison, phaseFromEngine, phaseId, roundOrder, serverSide } from '../dist/bench/suite/phases.js';
import type { ServerCounters } from '../dist/bench/server-process.js';
import type { PhaseResult } from '../dist/bench/suite-results.js';

describe('suite options', () => {
  it('full-run defaults, in the units the cases use', () => {
    const o = parseSuiteOptions(['--no-progress']);
    expect(o).toMatchObject({ quick: false, models: ['tiny-embed', 'minilm-l6'], rounds: 3, warmupMs: 500, durationMs: 3000, curvePointMs: 2500, sloP99Ms: 50, seed: 1, device: 'cpu', progress: false });
    expect([...o.cases]).toEqual(['batching', 'bucketing', 'efficiency', 'curve', 'scheduling', 'defaults', 'peer', 'instances', 'floor', 'models']);
    expect(o.loadFractions).toEqual([0.1, 0.25, 0.5, 0.75, 0.9, 1, 1.2]);
    expect(o.out).toBeUndefined();
    expect(o.gpuResults).toBeUndefined();
  });

  it('--quick defaults, and given values over them', () => {
    const o = parseSuiteOptions(['--quick', '--cases', 'efficiency,batching', '--duration-s', '2']);
    expect(o).toMatchObject({ quick: true, models: ['tiny-embed'], rounds: 1, warmupMs: 300, durationMs: 2000, curvePointMs: 1500 });
    expect([...o.cases]).toEqual(['efficiency', 'batching']);
    expect(o.loadFractions).toEqual([0.25, 0.75, 1, 1.2]);
  });
});

describe('suite phases', () => {
  it('phase ids name the case, model, workload, shape, target and round', () => {
    expect(phaseId(closedLoopMeta('batching', 'tiny-embed', 'short', 'max-batch-size 1', 'http', 2, 64))).toBe('batching/tiny-embed/short/http-64/max-batch-size-1/r2');
    const open = { case: 'curve', model: 'm', workload: 'short', target: 'defaults', transport: 'http', loop: 'open', round: 1, loadFraction: 0.75, arrivals: 'bursts' } as const;
    expect(phaseId(open)).toBe('curve/m/short/http-75pct-bursts/defaults/r1');
  });

  it("the server side de-cumulates the batch-size histogram over the window", () => {
    const counters = (batches: number, rows: number, le: [number, number][], real: number, padded: number, runS: number): ServerCounters => ({
      batches,
      rows,
      runSeconds: runS,
      realTokens: real,
      paddedTokens: padded,
      batchSizeLe: new Map(le),
      threadCpuS: new Map(),
    });
    const before = counters(10, 40, [[1, 2], [8, 6], [32, 10]], 100, 200, 1);
    const after = counters(30, 200, [[1, 4], [8, 12], [32, 30]], 1100, 1700, 2.5);
    expect(serverSide(before, after, 3000)).toEqual({
      batches: 20,
      meanBatch: 8,
      paddingEfficiency: 0.6667,
      batchSizes: [
        { le: 1, count: 2 },
        { le: 8, count: 4 },
        { le: 32, count: 14 },
      ],
      deviceBusy: 0.5,
    });
  });

  it("an in-process engine loop's record: its rates over the window, its CPU per request, its batches as a server's", () => {
    const h = hdr.build({ numberOfSignificantValueDigits: 3, lowestDiscernibleValue: 1 });
    for (const us of [900, 1100, 1300]) h.recordValue(us);
    const batch = (batches: number, rows: number, real: number, padded: number, runSeconds: number) => ({ batches, rows, realTokens: real, paddedTokens: padded, runSeconds, batchSizeLe: new Map() });
    const meta = closedLoopMeta('batching', 'tiny-embed', 'short', 'engine batched', 'in-process', 1, 64);
    const p = phaseFromEngine(meta, { windowMs: 2000, cpuMs: 1200, before: batch(5, 50, 400, 500, 1), after: batch(105, 1250, 10_000, 12_500, 2.6), requests: 1200, inputs: 1200, tokens: 24_000, rejected: 0, errors: 0 }, h);
    expect(p).toMatchObject({ id: 'batching/tiny-embed/short/in-process-64/engine-batched/r1', rps: 600, inputsPerS: 600, tokensPerS: 12_000, cpuMsPerRequest: 1 });
    expect(p.server).toEqual({ batches: 100, meanBatch: 12, paddingEfficiency: 0.8, batchSizes: [], deviceBusy: 0.8 });
    expect(p.latencyMs.p50).toBeCloseTo(1.1, 2);
  });

  it('a comparison pairs the rounds, and falls back to B\'s one phase (the best raw run)', () => {
    const phase = (rps: number) => ({ rps }) as PhaseResult;
    const q = { id: 'x', case: 'efficiency', question: 'q', model: 'm', workload: 'short', transport: 'http', metric: 'rps' } as const;
    const paired = comparison(q, { label: 'a', phases: [phase(200), phase(300), phase(100)] }, { label: 'b', phases: [phase(100), phase(100), phase(100)] }, (p) => p.rps);
    expect(paired).toEqual({ ...q, a: { label: 'a', value: 200 }, b: { label: 'b', value: 100 }, ratio: 2, roundRatios: [2, 3, 1] });
    const oneB = comparison(q, { label: 'a', phases: [phase(50), phase(150)] }, { label: 'b', phases: [phase(100)] }, (p) => p.rps);
    expect(oneB.roundRatios).toEqual([0.5, 1.5]);
    expect(oneB.ratio).toBe(1);
  });

  it('rounds alternate the order of the sides: each side runs first in every other round', () => {
    expect([1, 2, 3, 4].map((k) => roundOrder(k, 2))).toEqual([[0, 1], [1, 0], [0, 1], [1, 0]]);
    expect([1, 2].map((k) => roundOrder(k, 3))).toEqual([[0, 1, 2], [2, 1, 0]]);
    expect(roundOrder(2, 1)).toEqual([0]);
  });
});
