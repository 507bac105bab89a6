/**
 * The inference thread's loop: take slot indices off the models' submit rings,
 * queue them by priority class and length bucket, ask the scheduler what to
 * run, run it, write each row back, and ring each owner's doorbell once per
 * finished batch. It also keeps what the scheduler and admission control
 * learn: the cost model and arrival rates (published into the slab), the fair
 * share of each class, and the padded tokens still queued.
 *
 * Up to `maxInflightBatches` batches per instance of a model are handed to
 * the device before the first ends (default 1: onnxruntime-node runs
 * synchronously on the thread that calls it, so requests that arrive during a
 * run wait in the ring and form the next batch the moment it ends; see
 * docs/architecture.md). A model with several instances (model-instances.ts)
 * runs that many batches side by side, and a free instance counts as an idle
 * device: nothing waits for company while one is free.
 *
 * A failed batch is split in halves and each half run again (recursively,
 * at most log2(batch size) levels), so only the inputs the model really
 * cannot run fail (SlotError.INPUT) and the others get their rows. A thread
 * the main thread has given up (its epoch is no longer the control block's:
 * see src/shared/control.ts) touches no slot again, whatever it was doing.
 */
import type { TraceBatch } from './batch-trace.js';
import { nowMs } from '../shared/clock.js';
import type { ControlBlock } from '../shared/control.js';
import { spinUntil, type Doorbell } from '../shared/doorbell.js';
import {
  Account,
  Counter,
  H_CHUNK,
  H_ERROR,
  H_GENERATION,
  H_HOLDER,
  H_LENGTH,
  H_OWNER,
  H_PRIORITY,
  H_TOKEN_PAGE,
  INTERLEAVE_CHUNK,
  SlotError,
  SlotState,
  T_DEADLINE,
  T_ENQUEUED,
  T_FINISHED,
  T_STARTED,
  holderMark,
  type Slab,
} from '../shared/slab.js';
import { ArrivalRate, CostModel, Utilization } from './cost-model.js';
import type { BatchStats, ModelRunner } from './runner.js';
import { DEFAULTS } from '../shared/options.js';
import {
  batchCapacity,
  bucketFor,
  decide,
  enqueue,
  FairShare,
  orderKey,
  type ModelQueue,
  type QueuedRequest,
  type SloModel,
} from './scheduler.js';

/**
 * What the loop needs of a model: its runner (tests pass fakes with these fields), and how many
 * batches it runs at once (its instances, model-instances.ts; default 1).
 */
export type LoopRunner = Pick<ModelRunner, 'spec' | 'slab' | 'options'> & {
  /** Runs a batch (ModelRunner.run); `queued`: requests of the model waiting when it was launched, its own among them. */
  run(slots: readonly number[], bucket: number, queued?: number): Promise<BatchStats>;
  readonly instances?: number;
  /**
   * Whether it starts a batch of `rows` in `bucket` now (default: yes), `queued` requests of the
   * model waiting (the batch's among them); if not, the loop waits for one of its batches to end.
   */
  takes?(rows: number, bucket: number, queued: number): boolean;
};

export interface SchedulingOptions {
  /** Weight of each priority class (index 0 = interactive, 1 = bulk). Default [4, 1]. */
  priorityWeights: number[];
  /** A class whose oldest request has waited this long goes first. Default 2000. */
  priorityAgeingMs: number;
  /** Latency target for the adaptive window; undefined keeps the fixed maxBatchDelayMs behaviour. */
  sloP99Ms?: number;
}

/**
 * The time the loop judges by and how it sleeps. Default: the shared epoch
 * clock (src/shared/clock.ts) and the doorbell's own wait. Tests pass a
 * virtual clock to drive the real loop through simulated time
 * (test/fixtures/scheduler-sim.ts).
 */
export interface LoopClock {
  now(): number;
  /** Resolves once `bell` has rung since `seen` was read, or after `timeoutMs` on this clock. */
  wait(bell: Doorbell, seen: number, timeoutMs: number): Promise<void>;
}

const REAL_CLOCK: LoopClock = { now: nowMs, wait: (bell, seen, timeoutMs) => bell.wait(seen, timeoutMs) };

export interface LoopOptions {
  maxInflightBatches: number;
  /** Default: the real clock. */
  clock?: LoopClock;
  scheduling?: SchedulingOptions;
  /** Called when a batch fails (the loop goes on). */
  onBatchError?: (model: string, error: unknown) => void;
  /** Called after every successful batch (metrics), and after every successful part of a split one. */
  onBatch?: (model: number, bucket: number, stats: BatchStats) => void;
  /** Tracing on: a successful batch's span, before its requests complete (batch-trace.ts). */
  traceBatch?: TraceBatch;
  /**
   * Split a failed batch in halves and run each again, recursively, so only
   * the inputs that make the run fail fail (default false: the whole batch
   * fails). The inference thread turns it on.
   */
  splitFailedBatches?: boolean;
  /** Called once a split batch is settled: how many of its inputs failed alone, how many ran, in how many extra runs. */
  onSplit?: (model: string, outcome: { failed: number; ran: number; runs: number }) => void;
  /**
   * The longest the loop sleeps with nothing queued (default 1000 ms): it refreshes the heartbeat
   * readiness needs, so keep it well under --heartbeat-timeout-ms. Work wakes it on its own
   * (a submit, a batch's end, a batch window).
   */
  idleWakeMs?: number;
  /**
   * Microseconds the loop spins, watching its bell, when it runs out of work, before it sleeps
   * (default 0: it sleeps at once). See DEFAULT_IDLE_SPIN_US.
   */
  idleSpinUs?: number;
  /** This thread's epoch (default: the control block's at construction); the loop stops touching slots once the block's moves on. */
  epoch?: number;
  /**
   * The shared slabs, when the runners write rows into private outputs
   * (Slab.withPrivateOutput): rows are copied into these slots only once
   * the loop has checked the slot is still its own. Default: the runners' slabs are shared.
   */
  sharedSlabs?: Slab[];
  /**
   * Test hook (SLABSERVE_TEST_HOOKS=1): asked at the top of every round, before anything is taken
   * in; while the promise it returns is pending the loop takes nothing in and starts nothing, so
   * what is submitted meanwhile waits on the rings and meets the scheduler all at once.
   */
  hold?: () => Promise<void> | undefined;
}

/** Spins until `bell` rings past `seen` or `us` microseconds have passed. */
export function spinFor(bell: Doorbell, seen: number, us: number): void {
  if (us > 0) spinUntil(bell, seen, nowMs() + us / 1000);
}

/** Wake at least this often when idle, to refresh the heartbeat (default; LoopOptions.idleWakeMs). */
export const IDLE_WAKE_MS = 1000;

/** A model the loop serves: its runner and what the loop learns and queues for it. */
interface LoopModel {
  /** Its plan's index (ModelPlan.index): its slab's identity in every thread, never reused. */
  readonly id: number;
  readonly runner: LoopRunner;
  readonly queue: ModelQueue;
  readonly costs: CostModel;
  readonly rates: ArrivalRate[];
  /** The shared slab, when the runner writes rows into a private output (LoopOptions.sharedSlabs). */
  readonly shared: Slab | undefined;
  /** Its batches running now. */
  running: number;
}

/** Sessions of a model that run batches side by side (LoopRunner.instances). */
const instancesOf = (m: LoopModel): number => m.runner.instances ?? 1;

export class InferenceLoop {
  /** The models served, in the order the scheduler sees them (`queues` is the same order). */
  private readonly models: LoopModel[] = [];
  private readonly queues: ModelQueue[] = [];
  /** The models the scheduler looks at this round: those with room for another batch (the SLO model indexes into it). */
  private open: LoopModel[] = [];
  private readonly control: ControlBlock;
  private readonly options: LoopOptions;
  private readonly scheduling: SchedulingOptions;
  private readonly fair: FairShare;
  private readonly utilization = new Utilization();
  private readonly slo: SloModel | undefined;
  private inflight = 0;
  /** Start times of the batches in flight: the oldest is published for the main thread's watchdog. */
  private readonly runStarts: number[] = [];
  private readonly epoch: number;
  /** Resolves the loop's wait when a batch ends (set while the loop waits with batches running). */
  private wakeLoop: (() => void) | null = null;
  /** Owners to wake after the current completion pass (bit per owner index). */
  private readonly ownersToWake = new Set<number>();
  private readonly clock: LoopClock;
  /** Whether a batch was launched since the loop last slept idle (it spins only then: idleSpinUs). */
  private launchedSinceSleep = false;

  /** `runners[i]` serves the model of id i (and `options.sharedSlabs[i]` is its shared slab); addModel() adds more. */
  constructor(runners: LoopRunner[], control: ControlBlock, options: LoopOptions) {
    this.control = control;
    this.options = options;
    this.clock = options.clock ?? REAL_CLOCK;
    this.epoch = options.epoch ?? control.epoch;
    this.scheduling = options.scheduling ?? { priorityWeights: DEFAULTS.priorities.map((p) => p.weight), priorityAgeingMs: DEFAULTS.priorityAgeingMs };
    this.fair = new FairShare(this.scheduling.priorityWeights);
    runners.forEach((r, id) => this.addModel(id, r, options.sharedSlabs?.[id]));
    const target = this.scheduling.sloP99Ms;
    this.slo =
      target === undefined
        ? undefined
        : {
            targetMs: target,
            costMs: (m, b, rows) => this.open[m]!.costs.predict(b, rows),
            arrivalsPerMs: (m, b, now) => this.open[m]!.rates[b]!.perMs(now),
            utilization: (now) => this.utilization.at(now),
          };
  }

  /** Serves one more model from the next round on (`shared`: as LoopOptions.sharedSlabs). */
  addModel(id: number, runner: LoopRunner, shared?: Slab): void {
    if (this.models.some((m) => m.id === id)) throw new Error(`model ${id} is served already`);
    const buckets = runner.options.buckets;
    const classes = this.scheduling.priorityWeights.length;
    const queue: ModelQueue = { options: runner.options, byClass: Array.from({ length: classes }, () => buckets.map(() => [] as QueuedRequest[])) };
    const costs = new CostModel(buckets, buckets.map((len) => batchCapacity(runner.options, len)));
    this.models.push({ id, runner, queue, costs, rates: buckets.map(() => new ArrivalRate()), shared, running: 0 });
    this.queues.push(queue);
  }

  /**
   * Stops serving a model. Only an idle one: nothing on its ring, queued or running (the
   * main thread retires a model from the gateways and waits for its slots to come back first).
   */
  removeModel(id: number): void {
    const at = this.models.findIndex((m) => m.id === id);
    const m = this.models[at];
    if (!m) throw new Error(`model ${id} is not served`);
    if (m.running > 0 || this.queuedOf(m) > 0 || m.runner.slab.submit.size() > 0) throw new Error(`model ${id} still has work: it cannot be removed`);
    this.models.splice(at, 1);
    this.queues.splice(at, 1);
  }

  /** The model of `id`. */
  private model(id: number): LoopModel {
    const m = this.models.find((x) => x.id === id);
    if (!m) throw new Error(`model ${id} is not served`);
    return m;
  }

  /** Seeds the cost model (warm-up timings) and publishes it. */
  seedCost(id: number, bucket: number, rows: number, ms: number): void {
    const m = this.model(id);
    m.costs.observe(bucket, rows, ms);
    this.publishCost(m, bucket);
  }

  /** Whether this thread is still the live inference thread (the main thread has not given it up). */
  alive(): boolean {
    return this.control.epoch === this.epoch;
  }

  /**
   * Runs until the control block's stop flag is set, then fails what is still
   * queued; or until the main thread gives this thread up, then returns at
   * once (the main thread answers its requests).
   */
  async run(): Promise<void> {
    const bell = this.control.workerBell;
    while (!this.control.stopRequested() && this.alive()) {
      const held = this.options.hold?.();
      if (held) {
        await held;
        continue; // look at the stop flag and the epoch again before taking anything in
      }
      const seen = bell.read();
      this.intake();
      const now = this.clock.now(); // after intake, so nothing taken in is judged by a stale clock
      this.control.heartbeat = now;
      this.sweep(now);
      let timeout = this.options.idleWakeMs ?? IDLE_WAKE_MS;
      while (this.inflight < this.inflightLimit() && this.findOpen()) {
        const d = decide(
          this.open.length === this.models.length ? this.queues : this.open.map((m) => m.queue),
          {
            nowMs: this.clock.now(),
            deviceIdle: this.inflight === 0 || this.open.some((m) => m.running < instancesOf(m)),
            fair: this.fair,
            ageingMs: this.scheduling.priorityAgeingMs,
            ...(this.slo ? { slo: this.slo } : {}),
          },
        );
        if (d.kind === 'run') {
          const m = this.open[d.model]!;
          const queued = this.queuedOf(m);
          if (m.runner.takes?.(d.count, d.bucket, queued) === false) break; // it runs once one of the model's batches ends
          this.launch(m, d.priority, d.bucket, d.count, queued);
          continue;
        }
        if (d.kind === 'wait') timeout = Math.min(timeout, Math.max(0, d.untilMs - this.clock.now()));
        break;
      }
      this.publishQueueDepth();
      if (this.inflight >= this.inflightLimit() || !this.mayStartAnother()) {
        // As many batches running as may be: wait for one to end, not on the bell, so submits meanwhile ring nobody.
        await new Promise<void>((resolve) => (this.wakeLoop = resolve));
      } else if (this.inflight > 0) {
        await Promise.race([this.clock.wait(bell, seen, timeout), new Promise<void>((resolve) => (this.wakeLoop = resolve))]);
      } else {
        // Idle: a submit rings the bell; otherwise wake when a batch window closes (or to refresh the heartbeat).
        // Spin only after work: a heartbeat wake-up at rest goes straight back to sleep.
        if (this.launchedSinceSleep && this.clock === REAL_CLOCK) spinFor(bell, seen, this.options.idleSpinUs ?? 0);
        this.launchedSinceSleep = false;
        await this.clock.wait(bell, seen, timeout);
      }
      this.wakeLoop = null;
    }
    if (this.alive()) await this.shutdown();
  }

  /**
   * Batches the loop hands out at once: maxInflightBatches per instance of the model with the
   * most. With one instance each, a second model waits for the first's batch, as one device does.
   */
  private inflightLimit(): number {
    let most = 1;
    for (const m of this.models) most = Math.max(most, instancesOf(m));
    return this.options.maxInflightBatches * most;
  }

  /**
   * Whether a submit now could start a batch before one of those running ends: some model has room
   * and would take a lone row (one whose lone path is busy would not: ModelInstances.takes).
   */
  private mayStartAnother(): boolean {
    return this.models.some((m) => this.hasRoom(m) && m.runner.takes?.(1, 0, this.queuedOf(m) + 1) !== false);
  }

  /** Fills `open` with the models that may start a batch now; whether any may. */
  private findOpen(): boolean {
    this.open = this.models.filter((m) => this.hasRoom(m));
    return this.open.length > 0;
  }

  /** Whether `m` runs fewer than maxInflightBatches per instance. */
  private hasRoom(m: LoopModel): boolean {
    return m.running < this.options.maxInflightBatches * instancesOf(m);
  }

  /** Moves newly submitted slots from the rings into their class and bucket queues. */
  private intake(): void {
    const classes = this.fair.weights.length;
    for (const m of this.models) {
      const slab = m.runner.slab;
      const buckets = m.runner.options.buckets;
      for (let slot = slab.submit.pop(); slot !== -1; slot = slab.submit.pop()) {
        slab.setHeader(slot, H_HOLDER, holderMark(this.epoch, false)); // first: if this thread dies, the main thread answers it
        const length = slab.header(slot, H_LENGTH);
        const b = bucketFor(buckets, length);
        if (b < 0) {
          // Owners validate lengths; this guards the device against a bad writer.
          this.finish(m, slot, SlotState.FAILED, SlotError.INFERENCE);
          continue;
        }
        const priority = Math.min(Math.max(slab.header(slot, H_PRIORITY), 0), classes - 1);
        const enqueuedAt = slab.time(slot, T_ENQUEUED);
        const deadline = slab.time(slot, T_DEADLINE);
        // A chunk's quantum: about one full batch of its size, so other requests fit between chunks.
        const quantum = Math.max(0.5, m.costs.predict(b, INTERLEAVE_CHUNK));
        if (!this.hasQueued(priority)) this.fair.activate(priority, this.activeClasses());
        enqueue(m.queue.byClass[priority]![b]!, {
          slot,
          length,
          enqueuedAt,
          deadline,
          priority,
          key: orderKey(deadline, slab.header(slot, H_CHUNK), quantum),
        });
        m.rates[b]!.arrive(enqueuedAt);
      }
    }
    this.wakeOwners();
  }

  private hasQueued(cls: number): boolean {
    return this.queues.some((q) => q.byClass[cls]!.some((fifo) => fifo.length > 0));
  }

  private activeClasses(): number[] {
    return this.fair.weights.map((_, c) => c).filter((c) => this.hasQueued(c));
  }

  /** A request leaves the queue (into a batch, expired or cancelled): its padded tokens are no longer queued work. */
  private dequeued(m: LoopModel, slot: number, length: number): void {
    const r = m.runner;
    r.slab.setHeader(slot, H_HOLDER, holderMark(this.epoch, true));
    const b = bucketFor(r.options.buckets, length);
    Atomics.sub(r.slab.accounts, Account.QUEUED_TOKENS, r.options.buckets[b]!);
    Atomics.sub(r.slab.accounts, Account.QUEUED_BY_BUCKET + b, 1);
  }

  /** Drops cancelled requests (freeing their slots) and fails expired ones before they reach the device. */
  private sweep(now: number): void {
    for (const m of this.models) {
      const slab = m.runner.slab;
      for (const byBucket of m.queue.byClass) {
        for (const fifo of byBucket) {
          let kept = 0;
          for (const q of fifo) {
            const state = slab.state(q.slot);
            if (state === SlotState.CANCELLED) {
              this.dequeued(m, q.slot, q.length);
              this.freeCancelled(m, q.slot);
            } else if (q.deadline <= now) {
              this.dequeued(m, q.slot, q.length);
              this.expire(m, q.slot, q.length);
            } else {
              fifo[kept++] = q;
            }
          }
          fifo.length = kept;
        }
      }
    }
    this.wakeOwners();
  }

  /** Starts a batch of `count` from a class and bucket of `model`'s queue, `queued` requests of the model waiting (the batch's among them). */
  private launch(model: LoopModel, priority: number, bucket: number, count: number, queued: number): void {
    const runner = model.runner;
    const slab = runner.slab;
    const taken = model.queue.byClass[priority]![bucket]!.splice(0, count);
    const slots: number[] = [];
    const now = this.clock.now();
    // A request that would only finish after its deadline does not run: its answer would be a timeout anyway.
    const finishesAt = now + model.costs.predict(bucket, taken.length);
    for (const q of taken) {
      this.dequeued(model, q.slot, q.length);
      if (q.deadline <= finishesAt) {
        this.expire(model, q.slot, q.length);
        continue;
      }
      const found = slab.transition(q.slot, SlotState.QUEUED, SlotState.RUNNING);
      if (found === SlotState.QUEUED) slots.push(q.slot);
      else if (found === SlotState.CANCELLED) this.freeCancelled(model, q.slot);
    }
    if (slots.length === 0) {
      this.wakeOwners();
      return;
    }
    this.fair.charge(priority, slots.length * runner.options.buckets[bucket]!);
    slab.counters[Counter.BUSY_UNTIL] = now + model.costs.predict(bucket, slots.length);
    this.inflight++;
    this.launchedSinceSleep = true;
    model.running++;
    this.control.inflightBatches = this.inflight;
    const started = this.clock.now();
    this.runStarts.push(started);
    this.publishRunStart();
    const generations = slots.map((slot) => slab.header(slot, H_GENERATION));
    void this.execute(model, bucket, slots, generations, started, queued).finally(() => {
      if (!this.alive()) return; // given up: the main thread has answered these requests
      this.inflight--;
      model.running--;
      this.control.inflightBatches = this.inflight;
      this.runStarts.splice(this.runStarts.indexOf(started), 1);
      this.control.heartbeat = this.clock.now(); // before the run start is cleared: the watchdog never sees a stale heartbeat and no run
      this.publishRunStart();
      if (this.inflight === 0) slab.counters[Counter.BUSY_UNTIL] = 0; // nothing running: admission adds no remainder
      // The loop may now launch the next batch: wake it directly (ringing its own bell costs as much as waking another thread).
      const wake = this.wakeLoop;
      this.wakeLoop = null;
      if (wake) wake();
      else this.control.workerBell.ring(); // shutdown() waits on the bell
    });
  }

  private publishRunStart(): void {
    let oldest = 0;
    for (const t of this.runStarts) if (oldest === 0 || t < oldest) oldest = t;
    this.control.runStartedAt = oldest;
  }

  /** Runs one batch and ends its requests; a failed batch is split (splitFailedBatches). */
  private async execute(model: LoopModel, bucket: number, slots: number[], generations: number[], started: number, queued: number): Promise<void> {
    const runner = model.runner;
    const slab = runner.slab;
    try {
      const stats = await runner.run(slots, bucket, queued);
      if (!this.alive()) return;
      this.recordRun(model, bucket, stats, started);
      this.completeBatch(model, slots, generations, started, SlotState.DONE, SlotError.NONE, { bucket, stats });
      return;
    } catch (err: unknown) {
      if (!this.alive()) return;
      slab.counters[Counter.FAILED_BATCHES]! += 1;
      this.options.onBatchError?.(runner.spec.name, err);
      if (slots.length < 2 || !this.options.splitFailedBatches) {
        this.completeBatch(model, slots, generations, started, SlotState.FAILED, SlotError.INFERENCE);
        return;
      }
    }
    await this.split(model, bucket, slots, generations, started);
  }

  /**
   * Finds the inputs of a failed batch that make it fail: runs each half
   * again, and each failing half's halves, down to single inputs (at most
   * ceil(log2 n) levels, 2n - 2 runs). Parts that run are answered at once.
   * An input that fails alone while others of its batch ran is the input's
   * fault (SlotError.INPUT, 422); if nothing ran, the device is (INFERENCE, 500).
   */
  private async split(model: LoopModel, bucket: number, slots: number[], generations: number[], started: number): Promise<void> {
    const runner = model.runner;
    const slab = runner.slab;
    const levels = Math.ceil(Math.log2(slots.length));
    const failed: { slots: number[]; generations: number[] } = { slots: [], generations: [] };
    let ran = 0;
    let runs = 0;
    const visit = async (part: number[], gens: number[], level: number): Promise<void> => {
      // Requests cancelled meanwhile are not run again: free them here (this thread sees them last).
      const live: number[] = [];
      const liveGens: number[] = [];
      part.forEach((slot, i) => {
        if (slab.header(slot, H_GENERATION) !== gens[i]) return;
        if (slab.state(slot) === SlotState.CANCELLED) this.freeCancelled(model, slot);
        else {
          live.push(slot);
          liveGens.push(gens[i]!);
        }
      });
      this.wakeOwners();
      if (live.length === 0) return;
      runs++;
      slab.counters[Counter.SPLIT_RUNS]! += 1;
      const partStarted = this.clock.now();
      let ok = false;
      try {
        const stats = await runner.run(live, bucket);
        if (!this.alive()) return;
        this.recordRun(model, bucket, stats, partStarted);
        this.completeBatch(model, live, liveGens, started, SlotState.DONE, SlotError.NONE, { bucket, stats });
        ran += live.length;
        ok = true;
      } catch {
        if (!this.alive()) return;
      }
      if (ok) return;
      if (live.length === 1 || level >= levels) {
        failed.slots.push(...live);
        failed.generations.push(...liveGens);
        return;
      }
      const half = Math.ceil(live.length / 2);
      await visit(live.slice(0, half), liveGens.slice(0, half), level + 1);
      await visit(live.slice(half), liveGens.slice(half), level + 1);
    };
    const half = Math.ceil(slots.length / 2);
    await visit(slots.slice(0, half), generations.slice(0, half), 1);
    await visit(slots.slice(half), generations.slice(half), 1);
    if (!this.alive()) return;
    const error = ran > 0 ? SlotError.INPUT : SlotError.INFERENCE;
    if (error === SlotError.INPUT) slab.counters[Counter.ISOLATED_INPUTS]! += failed.slots.length;
    this.completeBatch(model, failed.slots, failed.generations, started, SlotState.FAILED, error);
    this.options.onSplit?.(runner.spec.name, { failed: failed.slots.length, ran, runs });
  }

  /** Counters, cost model and metrics of a run that succeeded. */
  private recordRun(model: LoopModel, bucket: number, stats: BatchStats, started: number): void {
    const c = model.runner.slab.counters;
    c[Counter.BATCHES]! += 1;
    c[Counter.ROWS]! += stats.rows;
    c[Counter.REAL_TOKENS]! += stats.realTokens;
    c[Counter.PADDED_TOKENS]! += stats.paddedTokens;
    c[Counter.RUN_MS]! += stats.runMs;
    model.costs.observe(bucket, stats.rows, stats.runMs);
    this.utilization.busy(started, started + stats.runMs);
    this.publishCost(model, bucket);
    this.options.onBatch?.(model.id, bucket, stats);
  }

  /**
   * Ends the requests of a run. A slot whose generation changed is no longer
   * this batch's (the main thread answered it when it gave a thread up, and it
   * was reused): it is left alone. Rows written into a private output are
   * copied into the shared slot first.
   */
  private completeBatch(model: LoopModel, slots: number[], generations: number[], started: number, state: number, error: number, ran?: { bucket: number; stats: BatchStats }): void {
    const slab = model.runner.slab;
    const shared = model.shared;
    const finished = this.clock.now();
    if (ran && this.options.traceBatch) {
      const own = slots.filter((slot, i) => slab.header(slot, H_GENERATION) === generations[i]);
      const bucketLength = model.runner.options.buckets[ran.bucket]!;
      this.options.traceBatch(slab, own, { model: model.runner.spec.name, bucketLength, stats: ran.stats, startedMs: started, finishedMs: finished });
    }
    slots.forEach((slot, i) => {
      if (slab.header(slot, H_GENERATION) !== generations[i]) return;
      if (shared && state === SlotState.DONE) {
        shared.slotOutput(slot).set(slab.slotOutput(slot));
        const page = slab.header(slot, H_TOKEN_PAGE);
        const length = slab.header(slot, H_LENGTH);
        if (page > 0) shared.pageTokens(page - 1, length).set(slab.pageTokens(page - 1, length));
      }
      slab.setTime(slot, T_STARTED, started);
      slab.setTime(slot, T_FINISHED, finished);
      this.finish(model, slot, state, error, SlotState.RUNNING);
    });
    this.wakeOwners();
  }

  /** Fails a queued request whose deadline has passed; it never reaches the device. */
  private expire(model: LoopModel, slot: number, length: number): void {
    if (this.finish(model, slot, SlotState.FAILED, SlotError.DEADLINE, SlotState.QUEUED)) {
      const c = model.runner.slab.counters;
      c[Counter.DROPPED_EXPIRED]! += 1;
      c[Counter.EXPIRED_TOKENS]! += length;
    }
  }

  /**
   * Writes one bucket's cost into the slab, where gateways read it (admission, /info): the bucket just
   * observed, the only one that changed. (All of them each batch was 26 objects of garbage a batch.)
   */
  private publishCost(model: LoopModel, bucket: number): void {
    const k = model.costs.coefficient(bucket);
    model.runner.slab.setCost(bucket, k.fixedMs, k.perRowMs, k.samples);
  }

  /**
   * Ends a request: `from` -> `state` and onto its owner's completion queue.
   * If its owner cancelled it meanwhile, the slot is freed instead (returns false).
   */
  private finish(model: LoopModel, slot: number, state: number, error: number, from: number = SlotState.QUEUED): boolean {
    const slab = model.runner.slab;
    slab.setHeader(slot, H_ERROR, error);
    const found = slab.transition(slot, from, state);
    if (found === SlotState.CANCELLED) {
      this.freeCancelled(model, slot);
      return false;
    }
    if (found !== from) throw new Error(`slot ${slot} was ${found}, expected ${from}`);
    const owner = slab.header(slot, H_OWNER);
    slab.completions[owner]!.push(slot);
    this.ownersToWake.add(owner);
    return true;
  }

  private freeCancelled(model: LoopModel, slot: number): void {
    const slab = model.runner.slab;
    if (slab.transition(slot, SlotState.CANCELLED, SlotState.FREE) === SlotState.CANCELLED) {
      slab.counters[Counter.CANCELLED_SKIPPED]! += 1;
      slab.freeSlot(slot);
    }
  }

  /** One notify per owner per pass, however many of its requests finished. */
  private wakeOwners(): void {
    for (const owner of this.ownersToWake) this.control.ownerBell(owner).ring();
    this.ownersToWake.clear();
  }

  private publishQueueDepth(): void {
    for (const m of this.models) m.runner.slab.counters[Counter.QUEUED] = this.queuedOf(m);
  }

  /** Requests of `m` waiting in its class and bucket queues. */
  private queuedOf(m: LoopModel): number {
    let n = 0;
    for (const byBucket of m.queue.byClass) for (const fifo of byBucket) n += fifo.length;
    return n;
  }

  /** Lets running batches finish, then fails every request still queued or still arriving. */
  private async shutdown(): Promise<void> {
    while (this.inflight > 0) {
      const seen = this.control.workerBell.read();
      if (this.inflight > 0) await this.clock.wait(this.control.workerBell, seen, this.options.idleWakeMs ?? IDLE_WAKE_MS);
      if (!this.alive()) return;
    }
    this.intake();
    for (const m of this.models) {
      for (const byBucket of m.queue.byClass) {
        for (const fifo of byBucket) {
          for (const q of fifo) {
            this.dequeued(m, q.slot, q.length);
            this.finish(m, q.slot, SlotState.FAILED, SlotError.SHUTDOWN);
          }
          fifo.length = 0;
        }
      }
    }
    this.publishQueueDepth();
    this.wakeOwners();
  }
}
