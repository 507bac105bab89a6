/**
 * Doorbells: int32 counters in shared memory that one thread bumps and another
 * waits on. Waking a thread costs one Atomics.notify, whatever the number of
 * requests behind it: the inference thread rings an owner's bell once per
 * finished batch, a gateway rings the inference thread's bell once per submit.
 */
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
