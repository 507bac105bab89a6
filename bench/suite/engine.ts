/**
 * The in-process engine as a side of the suite's comparisons: createEngine()
 * in this process with the server's defaults, and `clients` closed-loop
 * callers of engine.embed(text) on a workload's texts (tokenizing included,
 * as the server's gateways do). It is the same request with no transport at
 * all, so it answers two questions the HTTP phases cannot alone: how much of
 * the engine HTTP keeps, and what batching buys with no per-request transport
 * cost diluting it (the bound the HTTP batching gain sits under).
 *
 * Its CPU is this process's (process.cpuUsage): the callers and every engine
 * thread. The engines stay open for all rounds; an idle one costs nothing
 * measurable while another side runs.
 */
import { createEngine, type Engine } from '../../src/engine.js';
import { newHistogram } from '../load.js';
import type { PhaseResult } from '../suite-results.js';
import type { Workload } from '../workloads.js';
import { phaseFromEngine, type BatchCounters, type PhaseMeta } from './phases.js';

export interface EngineSide {
  label: string;
  engine: Engine;
  model: string;
}

/** An engine for `model` with the server's defaults, and `maxBatchSize` where given (the unbatched side). */
export async function openEngineSide(label: string, device: string, modelsDir: string, model: string, maxBatchSize?: number): Promise<EngineSide> {
  const engine = await createEngine({
    modelsDir,
    models: [model],
    device,
    cacheMb: 0, // as the servers run (bench/server-process.ts): the workloads repeat texts
    ...(maxBatchSize !== undefined ? { batching: { maxBatchSize } } : {}),
    log: () => {},
  });
  return { label, engine, model };
}

/** What the engine counted, as a server's /metrics counters are read (it keeps no batch-size histogram). */
function engineCounters(side: EngineSide): BatchCounters {
  const s = side.engine.stats()[side.model]!;
  return { batches: s.batches, rows: s.rows, realTokens: s.realTokens, paddedTokens: s.paddedTokens, runSeconds: s.runMs / 1000, batchSizeLe: new Map() };
}

/**
 * One closed loop of `clients` callers on `w`'s requests (each caller's next
 * request when its last is answered), from request `start` on, warm-up first;
 * the requests answered inside the measured window count.
 */
export async function runEngineLoop(meta: PhaseMeta, side: EngineSide, w: Workload, clients: number, start: number, warmupMs: number, durationMs: number): Promise<PhaseResult> {
  const h = newHistogram();
  const counts = { requests: 0, inputs: 0, tokens: 0, rejected: 0, errors: 0, firstError: undefined as string | undefined };
  let next = start;
  let stop = false;
  let window = { from: Infinity, to: Infinity };
  const caller = async () => {
    while (!stop) {
      const inputs = w.requests[next++ % w.requests.length]!;
      const t0 = performance.now();
      try {
        // One text as a string, as the HTTP side sends {"inputs": text}.
        await side.engine.embed(inputs.length === 1 ? inputs[0]!.text : inputs.map((x) => x.text), { model: side.model });
      } catch (err) {
        counts.errors++;
        counts.firstError ??= (err as Error).message;
        await new Promise((r) => setImmediate(r)); // a call failing at once must not starve the window's timers
        continue;
      }
      const t1 = performance.now();
      if (t1 < window.from || t1 >= window.to) continue;
      h.recordValue(Math.max(1, Math.round((t1 - t0) * 1000)));
      counts.requests++;
      counts.inputs += inputs.length;
      for (const x of inputs) counts.tokens += x.ids.length;
    }
  };
  const callers = Array.from({ length: clients }, caller);
  await new Promise((r) => setTimeout(r, warmupMs));
  const before = engineCounters(side);
  const cpu0 = process.cpuUsage();
  window = { from: performance.now(), to: Infinity };
  await new Promise((r) => setTimeout(r, durationMs));
  window = { from: window.from, to: performance.now() };
  const cpu = process.cpuUsage(cpu0);
  const after = engineCounters(side);
  stop = true;
  await Promise.all(callers);
  return phaseFromEngine(meta, { windowMs: window.to - window.from, cpuMs: (cpu.user + cpu.system) / 1000, before, after, ...counts }, h);
}
