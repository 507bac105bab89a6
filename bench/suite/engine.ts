/**
 * The in-process engine as a side of the suite's comparisons: createEngine()
 * in this process and closed-loop callers of engine.embed(text), tokenizing
 * included. The same request with no transport at all: how much of the engine
 * HTTP keeps, and what batching buys with no per-request transport cost
 * diluting it. Its CPU is this process's (the callers and every engine thread).
 */
import { createEngine, type Engine } from '../../src/main/engine.js';
import { runClosedLoop } from '../closed-loop.js';
import type { PhaseResult } from '../suite-results.js';
import type { Workload } from '../workloads.js';
import { phaseFromEngine, type BatchCounters, type PhaseMeta } from './phases.js';

export interface EngineSide {
  label: string;
  engine: Engine;
  model: string;
}

/** What an engine sets beside the server's defaults: the unbatched side, the defaults and scheduling cases' engines. */
export interface EngineChoice {
  maxBatchSize?: number;
  maxBatchDelayMs?: number;
  maxBatchTokens?: number;
  maxInflightBatches?: number;
  intraOpThreads?: number;
  sloP99Ms?: number;
}

/** `o` without its undefined fields: an option given as undefined would not take its default. */
const defined = <T extends object>(o: T): T => Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;

/** An engine for `model` with the server's defaults, and what `choice` sets. */
export function openEngine(device: string, modelsDir: string, model: string, choice: EngineChoice = {}): Promise<Engine> {
  const { maxBatchSize, maxBatchDelayMs, maxBatchTokens, ...engine } = choice;
  const batching = defined({ maxBatchSize, maxBatchDelayMs, maxBatchTokens });
  // the result cache off, as the servers run (bench/server-process.ts): the workloads repeat texts
  return createEngine({ modelsDir, models: [model], device, cacheMb: 0, ...defined(engine), ...(Object.keys(batching).length ? { batching } : {}), log: () => {} });
}

/** What the engine counted, as a server's /metrics counters are read (it keeps no batch-size histogram). */
function engineCounters(side: EngineSide): BatchCounters {
  const s = side.engine.stats()[side.model]!;
  return { batches: s.batches, rows: s.rows, realTokens: s.realTokens, paddedTokens: s.paddedTokens, runSeconds: s.runMs / 1000, batchSizeLe: new Map() };
}

/**
 * One closed loop of `clients` callers on `w`'s requests (each caller's next
 * request when its last is answered), from request `start` on, warm-up first;
 * the requests answered inside the measured window count (bench/closed-loop.ts).
 */
export async function runEngineLoop(meta: PhaseMeta, side: EngineSide, w: Workload, clients: number, start: number, warmupMs: number, durationMs: number): Promise<PhaseResult> {
  const request = (n: number) => w.requests[(start + n) % w.requests.length]!;
  const sent = { inputs: 0, tokens: 0 };
  const loop = await runClosedLoop({
    clients,
    warmupMs,
    durationMs,
    call: (n) => {
      const inputs = request(n);
      // One text as a string, as the HTTP side sends {"inputs": text}.
      return side.engine.embed(inputs.length === 1 ? inputs[0]!.text : inputs.map((x) => x.text), { model: side.model });
    },
    counted: (n) => {
      const inputs = request(n);
      sent.inputs += inputs.length;
      for (const x of inputs) sent.tokens += x.ids.length;
    },
    snapshot: () => engineCounters(side),
  });
  return phaseFromEngine(meta, { ...loop, ...sent }, loop.histogram);
}
