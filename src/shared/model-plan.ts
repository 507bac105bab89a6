/**
 * A model as every thread sees it, made once at start (src/main/plan-models.ts)
 * and sent to each thread: plain data, with its slab's shared memory.
 */
import type { BatchingOptions } from './batching.js';
import type { ModelSpec } from './model-format/model-config.js';
import type { SlabLayout } from './slab.js';

/** A model as every thread sees it: its spec, its batching, its slab. Plain data: it crosses to workers. */
export interface ModelPlan {
  index: number;
  spec: ModelSpec;
  batching: BatchingOptions;
  /** Longest accepted input: the model's max length or the last bucket, whichever is shorter. */
  maxLength: number;
  /** Most rows in one batch of each bucket. */
  capacities: number[];
  slab: SharedArrayBuffer;
  layout: SlabLayout;
}
