/**
 * A bounded, lock-free multi-producer multi-consumer queue of int32 values
 * living in a SharedArrayBuffer (Dmitry Vyukov's bounded MPMC queue).
 *
 * Every cell carries a sequence number; producers and consumers claim a
 * position with one compareExchange on the tail or head counter and then
 * publish the cell by storing its sequence number. No locks, no ABA problem
 * (the sequence numbers are the version counters), and a full queue is an
 * immediate `false`, never a wait.
 *
 * Positions are int32 and wrap around: every comparison is done on the
 * wrapped difference `(a - b) | 0`, valid while capacity <= 2^30.
 *
 * Used for the submit ring (gateways -> inference thread), the free-slot list
 * and the per-owner completion queues.
 */

const HEAD = 0;
// Head and tail on separate 64-byte cache lines: producers and consumers
// would otherwise invalidate each other's line on every operation.
const TAIL = 16;
const CELLS = 32;

export class IndexQueue {
  readonly capacity: number;
  private readonly mask: number;
  private readonly a: Int32Array;

  /** Bytes a queue of `capacity` cells needs (capacity is rounded up to a power of two). */
  static byteLength(capacity: number): number {
    return (CELLS + 2 * roundUpPow2(capacity)) * 4;
  }

  /**
   * A view over `buffer` at `byteOffset`. Exactly one thread must call
   * `init()` before any thread uses the queue.
   */
  constructor(buffer: SharedArrayBuffer, byteOffset: number, capacity: number) {
    this.capacity = roundUpPow2(capacity);
    if (this.capacity > 1 << 30) throw new RangeError('IndexQueue capacity must be <= 2^30');
    this.mask = this.capacity - 1;
    this.a = new Int32Array(buffer, byteOffset, CELLS + 2 * this.capacity);
  }

  init(startPosition = 0): void {
    // `startPosition` exists so tests can start next to the int32 wrap-around.
    const start = startPosition | 0;
    Atomics.store(this.a, HEAD, start);
    Atomics.store(this.a, TAIL, start);
    for (let i = 0; i < this.capacity; i++) {
      const pos = (start + i) | 0;
      Atomics.store(this.a, CELLS + (pos & this.mask), pos);
    }
  }

  /** Appends `value`; false when the queue is full. */
  push(value: number): boolean {
    const a = this.a;
    let pos = Atomics.load(a, TAIL);
    for (;;) {
      const cell = pos & this.mask;
      const seq = Atomics.load(a, CELLS + cell);
      const dif = (seq - pos) | 0;
      if (dif === 0) {
        const seen = Atomics.compareExchange(a, TAIL, pos, (pos + 1) | 0);
        if (seen === pos) {
          Atomics.store(a, CELLS + this.capacity + cell, value);
          Atomics.store(a, CELLS + cell, (pos + 1) | 0);
          return true;
        }
        pos = seen;
      } else if (dif < 0) {
        return false; // the cell still holds an unconsumed value: full
      } else {
        pos = Atomics.load(a, TAIL);
      }
    }
  }

  /** Removes and returns the oldest value; -1 when the queue is empty. */
  pop(): number {
    const a = this.a;
    let pos = Atomics.load(a, HEAD);
    for (;;) {
      const cell = pos & this.mask;
      const seq = Atomics.load(a, CELLS + cell);
      const dif = (seq - ((pos + 1) | 0)) | 0;
      if (dif === 0) {
        const seen = Atomics.compareExchange(a, HEAD, pos, (pos + 1) | 0);
        if (seen === pos) {
          const value = Atomics.load(a, CELLS + this.capacity + cell);
          Atomics.store(a, CELLS + cell, (pos + this.mask + 1) | 0);
          return value;
        }
        pos = seen;
      } else if (dif < 0) {
        return -1; // nothing published at this position yet: empty
      } else {
        pos = Atomics.load(a, HEAD);
      }
    }
  }

  /** Approximate number of values queued (exact when no operation is in flight). */
  size(): number {
    const n = (Atomics.load(this.a, TAIL) - Atomics.load(this.a, HEAD)) | 0;
    return n < 0 ? 0 : n > this.capacity ? this.capacity : n;
  }
}

export function roundUpPow2(n: number): number {
  if (!Number.isInteger(n) || n < 1) throw new RangeError(`capacity must be a positive integer, got ${n}`);
  let c = 1;
  while (c < n) c *= 2;
  return c;
}
