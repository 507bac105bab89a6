/**
 * The inference hold, a test hook (SLABSERVE_TEST_HOOKS=1 only): the main
 * thread parks the inference loop at the top of its next round, before it
 * takes anything in, and later lets it go; whatever was submitted meanwhile
 * then meets the scheduler all at once, so a test can say how many batches
 * it makes. Shared memory, not a message: the supervisor makes the cell and
 * hands the same one to every thread it starts, so a hold outlasts a restart.
 *
 * A parked loop is not a hung one: it keeps its heartbeat fresh and runs no
 * batch, so neither watchdog (--heartbeat-timeout-ms, --inference-timeout-ms)
 * fires for it, and it still answers messages (metrics scrapes).
 */
import { nowMs } from '../shared/clock.js';

/** 1 while the main thread holds the loop. */
const HELD = 0;
/** 1 once a loop has parked for the hold (set by the inference thread, cleared on release). */
const PARKED = 1;

export class InferenceHold {
  readonly buffer: SharedArrayBuffer;
  private readonly cell: Int32Array;

  constructor(buffer: SharedArrayBuffer = new SharedArrayBuffer(2 * Int32Array.BYTES_PER_ELEMENT)) {
    this.buffer = buffer;
    this.cell = new Int32Array(buffer);
  }

  /** Main thread: the loop parks at the top of its next round (wake it, so that round comes now). */
  hold(): void {
    Atomics.store(this.cell, HELD, 1);
  }

  /** Main thread: the parked loop goes on. */
  release(): void {
    Atomics.store(this.cell, PARKED, 0);
    Atomics.store(this.cell, HELD, 0);
    Atomics.notify(this.cell, HELD);
  }

  /** Main thread: the thread that parked has been given up (its replacement says so again when it parks). */
  forgetParked(): void {
    Atomics.store(this.cell, PARKED, 0);
  }

  /** Main thread: resolves once a loop is parked; rejects after `limitMs` (a bound only to catch a hang). */
  async parked(limitMs: number): Promise<void> {
    const until = nowMs() + limitMs;
    while (Atomics.load(this.cell, PARKED) !== 1) {
      const left = until - nowMs();
      if (left <= 0) throw new Error(`no thread parked for the hold within ${limitMs} ms`);
      await Atomics.waitAsync(this.cell, PARKED, 0, left).value;
    }
  }

  /**
   * A session thread opening a model: blocks it (the thread, synchronously, as onnxruntime-node's
   * session creation does) while held; returns at once otherwise.
   */
  parkBlocking(): void {
    if (Atomics.load(this.cell, HELD) !== 1) return;
    Atomics.store(this.cell, PARKED, 1);
    Atomics.notify(this.cell, PARKED);
    while (Atomics.load(this.cell, HELD) === 1) Atomics.wait(this.cell, HELD, 1);
  }

  /**
   * Inference thread, LoopOptions.hold: undefined when not held; else a promise that settles on
   * release, or as soon as `stay()` says false (asked every `sliceMs`: it refreshes the heartbeat).
   */
  park(stay: () => boolean, sliceMs: number): Promise<void> | undefined {
    if (Atomics.load(this.cell, HELD) !== 1) return undefined;
    return (async () => {
      while (Atomics.load(this.cell, HELD) === 1 && stay()) {
        Atomics.store(this.cell, PARKED, 1); // every time round: a release and a new hold between two looks cleared it
        Atomics.notify(this.cell, PARKED);
        await Atomics.waitAsync(this.cell, HELD, 1, sliceMs).value;
      }
    })();
  }
}
