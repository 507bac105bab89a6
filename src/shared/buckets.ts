/**
 * The bucket rule, one for every thread: an input of `length` tokens goes to
 * the smallest length bucket that holds it. The submitting threads use it to
 * count queued work per bucket (admission), the inference thread to queue and
 * batch (src/gpu-worker/scheduler.ts re-exports it with the batching rules).
 */

/** Index of the smallest bucket that holds `length` tokens, or -1 if none does. */
export function bucketFor(buckets: readonly number[], length: number): number {
  for (let i = 0; i < buckets.length; i++) if (length <= buckets[i]!) return i;
  return -1;
}
