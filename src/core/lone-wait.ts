/**
 * The lone wait: how a gateway thread waits for the answer to the only
 * request in the server (--lone-wait-us).
 *
 * A gateway waits for answers on its doorbell without blocking its event loop
 * (Atomics.waitAsync). When the answer comes, the thread has been asleep, and
 * an idle core takes tens of microseconds to wake: paid once per request by a
 * caller sending one request after another, a large share of its latency with
 * a small model. So a gateway serving such a lone caller holds
 * its thread for the answer instead, when that request is the only one in the
 * whole server: nothing else needs the thread meanwhile. A lone caller is one
 * whose last {@link LONE_STREAK} requests each found nothing else of this
 * thread's in flight: with several callers, their requests would arrive
 * during holds and wait for them, so the first overlap ends the streak. (A request that
 * arrived during a hold is read after it, when the held one is answered, so
 * it shows no overlap; the next one does. Its cost is its tokenizing, done
 * after the hold instead of during the run it would have queued behind. Two
 * callers in strict alternation never overlap, and count as one.) Until the batch starts it sleeps in short slices (after a
 * moment's watch); then it sleeps (Atomics.wait, no CPU) until shortly before
 * the batch's predicted end (the cost model's BUSY_UNTIL, which the inference
 * thread writes when it starts the batch), then spins on the bell, so it is
 * awake when the answer comes; a batch overdue by more than OVERDUE_MS it
 * sleeps on again until the answer wakes it.
 *
 * Bounded: after `maxUs` the thread goes back to its event loop and waits as
 * usual. Only where a run leaves a core free for the spin (a GPU, or a CPU run
 * on fewer intra-op threads than the machine has cores): it would slow the run.
 * Gateway threads only (gRPC's included): the main thread's event loop (the
 * in-process engine, the supervisors) is never held.
 */
import { availableParallelism } from 'node:os';
import { nowMs } from '../shared/clock.js';
import { spinUntil, type Doorbell } from '../shared/doorbell.js';
import { Counter, type Slab } from '../shared/slab.js';

/** Wake this long before the predicted end and spin from there: a timed sleep ends up to ~50 µs late, a prediction is off by as much. */
const WAKE_EARLY_MS = 0.15;
/** A shorter sleep is not worth its wake-up: spin through it. */
const MIN_SLEEP_MS = 0.05;
/**
 * A batch this far past its predicted end is slept on (woken by its answer), not spun on. It is late
 * because something else needed its core, and on 2 cores the spin would hold the other one
 * (docs/tuning.md, A lone caller).
 */
const OVERDUE_MS = 0.1;
/** While spinning, the batch's predicted end (BUSY_UNTIL) is looked at again this often. */
const SPIN_SLICE_MS = 0.05;
/**
 * A batch not started this long after the wait began is slept on, in slices of NOT_STARTED_SLICE_MS,
 * until it starts. Spinning through it instead (up to the whole bound) would hold one of 2 cores
 * while the inference thread wakes on the other, and delay the batch it waits for (docs/tuning.md).
 */
const NOT_STARTED_SPIN_MS = 0.05;
const NOT_STARTED_SLICE_MS = 0.1;
/** Requests in a row that found nothing else in flight: from then on the caller is taken to be alone. */
export const LONE_STREAK = 16;

export interface LoneWaitOptions {
  /** The longest the thread is held, in µs. */
  maxUs: number;
  /** After each wait: whether the answer came within it. */
  onWait?: (answered: boolean) => void;
}

export class LoneWait {
  private readonly bell: Doorbell;
  private readonly maxMs: number;
  private readonly onWait: ((answered: boolean) => void) | undefined;
  private readonly cores = availableParallelism();
  /** Requests submitted in a row while nothing else of this thread's was in flight. */
  private streak = 0;
  /** The slab of the latest request submitted: the one a lone wait waits on. */
  private slab: Slab | undefined;

  /** `bell`: the doorbell this thread's answers ring. */
  constructor(bell: Doorbell, opts: LoneWaitOptions) {
    this.bell = bell;
    this.maxMs = opts.maxUs / 1000;
    this.onWait = opts.onWait;
  }

  /** Called as each request is submitted to `slab`: whether others of this thread's were in flight then. */
  submitted(slab: Slab, othersInFlight: boolean): void {
    this.slab = slab;
    this.streak = othersInFlight ? 0 : this.streak + 1;
  }

  /**
   * Whether the one request in flight (this thread's only one, the latest
   * submitted) is a lone caller's, alone in the server, and its run leaves a
   * core free: worth holding the thread for.
   */
  applies(): boolean {
    const slab = this.slab;
    return this.streak >= LONE_STREAK && slab !== undefined && slab.slotsInUse() === 1 && slab.counters[Counter.RUN_CORES]! < this.cores;
  }

  /**
   * Holds this thread until the bell rings past `seen` (true) or the bound
   * passes (false): asleep until shortly before the batch's predicted end,
   * awake from there, asleep again once the batch is overdue.
   */
  wait(seen: number): boolean {
    const slab = this.slab!;
    const started = nowMs();
    const end = started + this.maxMs;
    for (let now = started; ; now = nowMs()) {
      if (this.bell.read() !== seen) return this.done(true);
      const busyUntil = slab.counters[Counter.BUSY_UNTIL]!; // 0 until its batch starts
      if (now >= end) return this.done(false);
      if (busyUntil === 0) {
        // Not started: the inference thread is taking it in, or waking for it. Watched a moment (awake,
        // it starts at once), then slept on in slices: a spin here holds a core that thread may need.
        if (now - started >= NOT_STARTED_SPIN_MS) this.bell.sleep(seen, Math.min(NOT_STARTED_SLICE_MS, end - now));
        else if (spinUntil(this.bell, seen, Math.min(now + SPIN_SLICE_MS, end))) return this.done(true);
        continue;
      }
      // Overdue: something took the run's core (a GC, another thread); a spin would hold the core it could use instead.
      if (now - busyUntil > OVERDUE_MS) {
        this.bell.sleep(seen, end - now);
        continue;
      }
      // Woken by the answer itself if the prediction was late (the cost model's can be, for a bucket seldom run).
      const wakeAt = Math.min(busyUntil - WAKE_EARLY_MS, end);
      if (wakeAt - now > MIN_SLEEP_MS) this.bell.sleep(seen, wakeAt - now);
      // Awake: watch the bell, and the prediction again every SPIN_SLICE_MS (the batch may not have started).
      else if (spinUntil(this.bell, seen, Math.min(now + SPIN_SLICE_MS, end))) return this.done(true);
    }
  }

  private done(answered: boolean): boolean {
    this.onWait?.(answered);
    return answered;
  }
}
