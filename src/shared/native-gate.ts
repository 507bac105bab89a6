/**
 * Keeps Worker.terminate() away from a thread that is inside a native call.
 *
 * Why: onnxruntime-node's session create, run and release, and koffi's calls,
 * are synchronous native calls. A worker terminated while inside one comes
 * back into a terminating environment, node-addon-api throws a Napi::Error
 * that nothing catches, and the whole process aborts ("terminate called after
 * throwing an instance of 'Napi::Error'", exit 134). Unguarded, a batch that
 * runs past --inference-timeout-ms would take the server down with every
 * request it holds, instead of having its inference thread replaced.
 *
 * So each thread that makes such calls owns one cell of a shared Int32Array
 * (a "family": an inference thread's cell 0, and one cell per session thread
 * it starts). The cell counts the thread's calls in progress, and carries a
 * SEALED bit the supervisor sets when it gives the thread up:
 *
 *   thread      enter: count + 1 unless SEALED (then AbandonedError); leave: count - 1
 *   supervisor  seal: set SEALED (no call starts from then on), then wait for
 *               the count to reach 0; terminate only once every cell it ends
 *               is sealed with nothing inside
 *
 * A sealed cell is never opened again: the thread was given up, and the only
 * thing left for it is to be terminated. A call that never returns (a device
 * hung) leaves its thread running, abandoned; it cannot abort the process
 * when it returns.
 */
import type { Worker } from 'node:worker_threads';

/** The bit a cell carries once sealed; below it, the native calls in progress. */
const SEALED = 1 << 30;
/** Cells in one family: the inference thread's, and at most this many less one session threads at a time. */
export const FAMILY_CELLS = 1024;
/** How often sealing looks again at a cell whose thread is inside a call. */
const SEAL_POLL_MS = 5;

/** Thrown by a call on a sealed cell: the thread was given up, and must not start a native call. */
export class AbandonedError extends Error {
  constructor() {
    super('this thread was given up: no native call may start in it');
    this.name = 'AbandonedError';
  }
}

/** A family of cells in shared memory: what a supervisor creates and hands to the thread it starts. */
export function newFamily(): SharedArrayBuffer {
  return new SharedArrayBuffer(FAMILY_CELLS * Int32Array.BYTES_PER_ELEMENT);
}

/** One thread's cell: it wraps each of the thread's native calls. */
export class NativeGate {
  readonly family: SharedArrayBuffer;
  readonly index: number;
  private readonly cells: Int32Array;

  constructor(family: SharedArrayBuffer, index: number) {
    this.family = family;
    this.cells = new Int32Array(family);
    if (!Number.isInteger(index) || index < 0 || index >= this.cells.length) throw new RangeError(`native gate index ${index} outside 0-${this.cells.length - 1}`);
    this.index = index;
  }

  /**
   * Runs `call`, which makes a native call now or in a later task (onnxruntime-node's promises
   * defer theirs with setImmediate), counted inside until it settles. Throws AbandonedError,
   * without calling it, once the cell is sealed.
   */
  async run<T>(call: () => Promise<T>): Promise<T> {
    this.enter();
    try {
      return await call();
    } finally {
      this.leave();
    }
  }

  /** run() for a synchronous call. */
  runSync<T>(call: () => T): T {
    this.enter();
    try {
      return call();
    } finally {
      this.leave();
    }
  }

  private enter(): void {
    for (;;) {
      const count = Atomics.load(this.cells, this.index);
      if ((count & SEALED) !== 0) throw new AbandonedError();
      if (Atomics.compareExchange(this.cells, this.index, count, count + 1) === count) return;
    }
  }

  private leave(): void {
    Atomics.sub(this.cells, this.index, 1);
  }
}

/** `indices` of `family`, or every cell of it. */
const cellsOf = (cells: Int32Array, indices?: readonly number[]) => (indices ? [...indices] : Array.from({ length: cells.length }, (_, i) => i));

/** Seals `indices` of `family` (default: every cell) now: no call starts in them from here on (the calls in progress go on). */
export function seal(family: SharedArrayBuffer, indices?: readonly number[]): void {
  const cells = new Int32Array(family);
  for (const i of cellsOf(cells, indices)) Atomics.or(cells, i, SEALED);
}

/** Those of `indices` (default: every cell) with a native call in progress. */
export function callsInside(family: SharedArrayBuffer, indices?: readonly number[]): number[] {
  const cells = new Int32Array(family);
  return cellsOf(cells, indices).filter((i) => (Atomics.load(cells, i) & ~SEALED) !== 0);
}

/**
 * Seals `indices` of `family` (default: every cell), and resolves once the calls in progress in
 * them have returned. Never resolves while a call does not return.
 */
export async function sealCells(family: SharedArrayBuffer, indices?: readonly number[]): Promise<void> {
  seal(family, indices);
  for (let inside = callsInside(family, indices); inside.length > 0; inside = callsInside(family, inside)) {
    await new Promise((r) => setTimeout(r, SEAL_POLL_MS).unref());
  }
}

/**
 * Terminates `worker` once the cells its threads use (`indices` of `family`; default every cell:
 * the thread and every session thread it started, which end with it) are sealed: never while one
 * of them is inside a native call. Resolves once the thread has exited.
 */
export async function terminateOutsideNativeCalls(worker: Worker, family: SharedArrayBuffer, indices?: readonly number[]): Promise<void> {
  await sealCells(family, indices);
  await worker.terminate();
}

/**
 * Hands out a family's cells to the session threads an inference thread starts (cell 0 is the
 * inference thread's own). A cell comes back once its thread has exited of itself; a sealed one
 * stays sealed, so a thread given up cannot start a native call in a new session thread either.
 */
export class SessionCells {
  readonly family: SharedArrayBuffer;
  private readonly free: number[];

  constructor(family: SharedArrayBuffer) {
    this.family = family;
    this.free = Array.from({ length: FAMILY_CELLS - 1 }, (_, i) => FAMILY_CELLS - 1 - i); // 1 is taken first
  }

  take(): NativeGate {
    const index = this.free.pop();
    if (index === undefined) throw new Error(`more than ${FAMILY_CELLS - 1} session threads at once`);
    return new NativeGate(this.family, index);
  }

  /** The cell of a session thread that has exited (no call can be inside it). */
  give(gate: NativeGate): void {
    this.free.push(gate.index);
  }
}
