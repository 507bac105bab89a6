/**
 * A model's batching, as every thread sees it (it travels in the model's plan),
 * and the bucket rule, one for every thread: an input of `length` tokens goes
 * to the smallest length bucket that holds it. The submitting threads use it to
 * count queued work per bucket (admission), the inference thread to queue and
 * batch (src/gpu-worker/scheduler.ts re-exports these with the batching rules).
 */

export interface BatchingOptions {
  /** Most requests in one batch. */
  maxBatchSize: number;
  /** Longest a request waits for its batch to fill while the device is busy. */
  maxBatchDelayMs: number;
  /** Most padded tokens (batch size x bucket length) in one batch. */
  maxBatchTokens: number;
  /** Padded lengths, ascending; the last is the longest input accepted. */
  buckets: number[];
  /**
   * What a batch is padded to: 'bucket' pads every row to its bucket's length
   * (fixed shapes, all warmed at start-up: the choice for GPUs), 'longest' to
   * the longest input in the batch (fewer padded tokens where shapes cost
   * nothing extra, as on CPU: docs/tuning.md), 'auto' (default) picks 'longest' on CPU and 'bucket' on CUDA.
   * With one bucket, 'longest' is the classic single FIFO queue padded to the
   * longest.
   */
  padTo: PadTo;
}

export type PadTo = 'auto' | 'bucket' | 'longest';
export const PAD_TO: readonly PadTo[] = ['auto', 'bucket', 'longest'];

/** Index of the smallest bucket that holds `length` tokens, or -1 if none does. */
export function bucketFor(buckets: readonly number[], length: number): number {
  for (let i = 0; i < buckets.length; i++) if (length <= buckets[i]!) return i;
  return -1;
}
