/**
 * One clock for every thread. `performance.now()` is relative to each thread's
 * own start, so times written into shared memory by one thread and read by
 * another must be absolute: epoch milliseconds with sub-millisecond resolution.
 */
export function nowMs(): number {
  return performance.timeOrigin + performance.now();
}
