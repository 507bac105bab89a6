/**
 * This thread's performance.timeOrigin, read once: it never changes, and its getter is a binding call
 * returning a fresh heap number (at one connection ~900 bytes of a gateway's garbage per request,
 * from the lone wait's clock reads).
 */
const TIME_ORIGIN = performance.timeOrigin;

/**
 * One clock for every thread. `performance.now()` is relative to each thread's
 * own start, so times written into shared memory by one thread and read by
 * another must be absolute: epoch milliseconds with sub-millisecond resolution.
 */
export function nowMs(): number {
  return TIME_ORIGIN + performance.now();
}

/**
 * Whether `promise` settles (resolves or rejects) within `ms`: how a supervisor
 * gives a thread or process time to end before it ends it. The timer does not
 * keep the process alive, and is cleared once the promise settles.
 */
export async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const inTime = promise.then(
    () => true,
    () => true,
  );
  const late = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), ms).unref()));
  try {
    return await Promise.race([inTime, late]);
  } finally {
    clearTimeout(timer);
  }
}
