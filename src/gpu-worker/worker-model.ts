/** A model as an inference thread (and its session threads) receive it. */
import type { ModelSpec } from '../shared/model-format/model-config.js';
import type { SlabLayout } from '../shared/slab.js';
import type { BatchingOptions } from './scheduler.js';

/** A model as an inference thread needs it: its plan's id and spec, its slab, its batching. */
export interface WorkerModel {
  /** ModelPlan.index: the slab's identity in every thread, never reused. */
  id: number;
  spec: ModelSpec;
  slab: SharedArrayBuffer;
  layout: SlabLayout;
  batching: BatchingOptions;
}
