/**
 * Garbage collection at rest. V8's memory reducer collects a thread's garbage
 * some seconds after its heap stops growing (up to three incremental GCs, the
 * first 8 s after the last full one): for a server that has just started, that
 * is every thread's start-up garbage (model files read, graphs prepared,
 * tokenizers built), collected between 8 and 40 s after ready by each of the
 * process's isolates in turn (main, gateways, inference, a session thread per
 * extra model instance): well above what an idle server should cost.
 *
 * So the CLI turns the reducer off for the threads it starts (turnOffMemoryReducer)
 * and each thread collects its start-up garbage itself, once, when it is ready
 * (collectStartupGarbage: the gateways, the inference thread and session threads
 * always, the main thread in the CLI only, as an embedding application's is its own):
 * a fraction of the CPU over the same window, and less RSS after it, since the GC
 * runs at once instead of after the window. Under load, V8 collects as it always does.
 */
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

let gc: (() => void) | undefined;

/** A full GC of this thread's heap, now: call it once the thread's start-up is over. */
export function collectStartupGarbage(): void {
  if (!gc) {
    setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as () => void; // the flag holds for contexts made after it
  }
  gc();
}

/**
 * No memory reducer in the isolates created from now on (V8 reads the flag when it sets up a
 * heap: the threads this process starts next, not the calling one). For the CLI only: the
 * flag is process-wide, which an application embedding the engine may not want.
 */
export function turnOffMemoryReducer(): void {
  setFlagsFromString('--no-memory-reducer');
}
