/**
 * Doorbells: int32 counters in shared memory that one thread bumps and another
 * waits on. Waking a thread costs one Atomics.notify, whatever the number of
 * requests behind it: the inference thread rings an owner's bell once per
 * finished batch, a gateway rings the inference thread's bell once per submit.
 */
import { nowMs } from './clock.js';

/**
 * Turns of a spin between clock reads. performance.now() is not inlined into
 * a loop, so each read allocates a heap number: a spin reading it every turn
 * makes garbage fast enough that, even at one connection, the inference
 * thread and the gateway each scavenge many times a second. A turn is one
 * Atomics.load, so the clock is still read every few microseconds.
 */
const TURNS_PER_CLOCK_READ = 256;

/** Spins until `bell` has been rung since `seen` (true) or the clock (nowMs) passes `untilMs` (false). */
export function spinUntil(bell: Pick<Doorbell, 'read'>, seen: number, untilMs: number): boolean {
  for (let turn = 0; ; turn++) {
    if (bell.read() !== seen) return true;
    if (turn % TURNS_PER_CLOCK_READ === 0 && nowMs() >= untilMs) return false;
  }
}

export class Doorbell {
  private readonly a: Int32Array;
  private readonly index: number;

  constructor(cells: Int32Array, index: number) {
    this.a = cells;
    this.index = index;
  }

  /** Current count; pass it to wait() to sleep until the next ring. */
  read(): number {
    return Atomics.load(this.a, this.index);
  }

  ring(): void {
    Atomics.add(this.a, this.index, 1);
    Atomics.notify(this.a, this.index);
  }

  /**
   * Blocks this thread until the bell has been rung since `seen` was read, or
   * for `timeoutMs` (read() tells which). Its event loop stands still
   * meanwhile: for a thread that has nothing else to do.
   */
  sleep(seen: number, timeoutMs: number): void {
    Atomics.wait(this.a, this.index, seen, timeoutMs);
  }

  /**
   * Resolves once the bell has been rung since `seen` was read, or after
   * `timeoutMs`. Never blocks the event loop.
   */
  async wait(seen: number, timeoutMs = Infinity): Promise<void> {
    const r = Atomics.waitAsync(this.a, this.index, seen, timeoutMs);
    if (r.async) await r.value;
  }
}
