/**
 * What every case gets: the settings, the models, the progress display, the
 * records so far, and the three ways a case measures (one load phase, A/B
 * rounds of closed loops, a comparison of two sides).
 */
import { mulberry32 } from '../../models/generator/rng.js';
import { runLoad, type Arrivals } from '../load.js';
import type { CaseName, Comparison, Curve, PhaseResult } from '../suite-results.js';
import type { Workload } from '../workloads.js';
import type { SuiteOptions } from './options.js';
import type { SchedulingSection } from './scheduling/aggregate.js';
import { closedLoopMeta, comparison, describePhase, phaseFromLoad, roundOrder, type PhaseMeta, type Side } from './phases.js';
import type { Progress } from './progress.js';
import type { ModelSetup } from './setup.js';
import { openEngine, runEngineLoop, type EngineChoice, type EngineSide } from './engine.js';
import { startSlabserve, type Target } from './targets.js';

/** Closed-loop callers for the throughput phases (enough to fill batches of 32 twice over). */
export const CLIENTS = 64;

export class SuiteContext {
  readonly phases: PhaseResult[] = [];
  readonly comparisons: Comparison[] = [];
  readonly curves: Curve[] = [];
  readonly notes: { case: CaseName; line: string }[] = [];
  /** The scheduling case's rows (scheduling.ts), once it has run. */
  scheduling: SchedulingSection | undefined;
  /** One generator for every load phase's draws, in the order the phases run (the run is reproducible from --seed). */
  private readonly loadRandom: () => number;

  constructor(
    readonly options: SuiteOptions,
    readonly models: ModelSetup[],
    readonly progress: Progress,
  ) {
    this.loadRandom = mulberry32(options.seed);
  }

  /** `slabserve serve` for model `m` on the suite's device, with `extra` flags (and `env`). */
  startSlabserve(label: string, m: ModelSetup, extra: string[], env?: Record<string, string>) {
    return startSlabserve(label, this.options.device, m.dir, m.name, extra, env);
  }

  /** A figure that is not a phase, logged and shown in its case's section. */
  note(c: CaseName, line: string): void {
    this.notes.push({ case: c, line });
    this.progress.log(`${c}: ${line}`);
  }

  /** A phase measured by the case itself (gRPC's), recorded. */
  record(p: PhaseResult): PhaseResult {
    this.phases.push(p);
    this.progress.log(`${p.id}: ${describePhase(p)}`);
    return p;
  }

  /** An in-process engine for model `m` on the suite's device (engine.ts), with what `choice` sets. */
  async openEngine(label: string, m: ModelSetup, choice?: EngineChoice): Promise<EngineSide> {
    return { label, engine: await openEngine(this.options.device, m.dir, m.name, choice), model: m.name };
  }

  /** One load phase against a target, recorded. */
  async load(meta: PhaseMeta, target: Target, w: Workload, arrivals: Arrivals, durationMs = this.options.durationMs, traceparent?: number): Promise<PhaseResult> {
    const { warmupMs } = this.options;
    const shape = arrivals.kind === 'closed' ? `${arrivals.concurrency} clients` : `${Math.round((meta.loadFraction ?? 0) * 100)}%`;
    const label = `${meta.case} ${meta.model} ${meta.target} ${meta.transport} ${shape}`;
    const totalS = (warmupMs + durationMs) / 1000;
    this.progress.start(label, totalS);
    const o = await runLoad(
      {
        target,
        model: meta.model,
        transport: meta.transport as 'http' | 'ws',
        ...(traceparent !== undefined ? { traceparent } : {}),
        workload: w,
        arrivals,
        warmupMs,
        durationMs,
        generator: this.options.loadGenerator,
        onProgress: (p) => this.progress.tick(p.elapsedMs / p.totalMs, `${p.answered} answered, ${p.rejected} rejected, ${p.errors} errors`),
      },
      this.loadRandom,
    );
    const p = phaseFromLoad({ ...meta, ...(target.serverArgs ? { serverArgs: target.serverArgs } : {}) }, o);
    this.phases.push(p);
    this.progress.finish(label, totalS, describePhase(p));
    return p;
  }

  /** One closed loop of `clients` in-process callers on an engine side (engine.ts), recorded. */
  async engineLoad(meta: PhaseMeta, side: EngineSide, w: Workload, clients: number): Promise<PhaseResult> {
    const { warmupMs, durationMs } = this.options;
    const label = `${meta.case} ${meta.model} ${side.label} in-process ${clients} callers`;
    const totalS = (warmupMs + durationMs) / 1000;
    this.progress.start(label, totalS);
    const start = Math.floor(this.loadRandom() * w.requests.length);
    const p = await runEngineLoop(meta, side, w, clients, start, warmupMs, durationMs);
    this.phases.push(p);
    this.progress.finish(label, totalS, describePhase(p));
    return p;
  }

  /** Runs `sides` in alternating order (A B, B A, A B ...: roundOrder) for --rounds rounds; returns each side's phases, in round order. */
  async ab(run: (side: number, roundNo: number) => Promise<PhaseResult>, sides: number): Promise<PhaseResult[][]> {
    const out: PhaseResult[][] = Array.from({ length: sides }, () => []);
    for (let k = 1; k <= this.options.rounds; k++) for (const s of roundOrder(k, sides)) out[s]!.push(await run(s, k));
    return out;
  }

  /**
   * A/B rounds of the same closed loop (`clients` callers on workload `w`) against each target and,
   * in the same rounds, on each in-process engine side (`engines`): the targets' phases first, then
   * the engines'.
   */
  closedRounds(c: CaseName, model: string, targets: Target[], transport: 'http' | 'ws', w: Workload, clients: number, engines: EngineSide[] = []): Promise<PhaseResult[][]> {
    return this.ab((s, k) => {
      if (s < targets.length) return this.load(closedLoopMeta(c, model, w.name, targets[s]!.label, transport, k, clients), targets[s]!, w, { kind: 'closed', concurrency: clients });
      const e = engines[s - targets.length]!;
      return this.engineLoad(closedLoopMeta(c, model, w.name, e.label, 'in-process', k, clients), e, w, clients);
    }, targets.length + engines.length);
  }

  /** Records A against B on the comparison's metric, or on `pick` (see comparison()). */
  compare(c: Omit<Comparison, 'a' | 'b' | 'ratio' | 'roundRatios'>, a: Side, b: Side, pick?: (p: PhaseResult) => number): void {
    this.comparisons.push(comparison(c, a, b, pick));
  }
}
