/**
 * How a model's work is spread over the CPU's cores when --intra-op-threads
 * and --model-instances are 0 (the defaults): several cores per run for a wide
 * model, several runs side by side for a narrow one. Apart from runner.ts,
 * which opens the sessions, so that the main thread can say what was chosen
 * without loading onnxruntime.
 */
import { availableParallelism } from 'node:os';
import { AUTO_INSTANCES_MAX } from '../shared/options.js';

/** Below this hidden size a model's operators are too small to split over threads (autoIntraOpThreads). */
export const SPLIT_HIDDEN_SIZE = 256;

/**
 * Intra-op threads when 0 is asked: every core, for a model whose operators
 * are worth splitting; one thread for a model narrower than SPLIT_HIDDEN_SIZE.
 * The pool sleeps between runs (INTRA_OP_SPINNING) and gives way to the
 * gateways (--intra-op-nice), so it takes mostly the CPU they leave idle.
 *
 * Why the split at SPLIT_HIDDEN_SIZE: on a narrow model (tiny-embed, hidden
 * 128) one thread takes less CPU per request than two and serves as many
 * requests or more from a few connections up; alone, a run of several rows
 * ends sooner on two threads but for much more CPU, and a row alone is slower
 * on two. A wider model (minilm-l6, hidden 384) is the other way: two threads
 * serve more requests under load, and its runs are faster. With one
 * connection two threads answer sooner either way, for more CPU:
 * --intra-op-threads 2 for that. docs/tuning.md (CPU threads) has the figures.
 */
export function autoIntraOpThreads(hiddenSize: number): number {
  return hiddenSize < SPLIT_HIDDEN_SIZE ? 1 : Math.max(1, availableParallelism());
}

/** The intra-op threads a session gets: `asked` (--intra-op-threads), or the auto rule for 0. */
export function intraOpThreadsFor(asked: number, hiddenSize: number): number {
  return asked === 0 ? autoIntraOpThreads(hiddenSize) : asked;
}

/** Cores one run of a model keeps busy: its intra-op threads on CPU, none on a GPU (the gateways' lone wait reads it). */
export function coresPerRun(device: 'cpu' | 'cuda', asked: number, hiddenSize: number): number {
  return device === 'cpu' ? intraOpThreadsFor(asked, hiddenSize) : 0;
}


/**
 * Instances of a model (model-instances.ts) when --model-instances is 0 (the
 * default): on CPU, one per core up to AUTO_INSTANCES_MAX for a model whose
 * runs take one core each (a narrow one, with --intra-op-threads left to 0);
 * otherwise one. On a GPU one instance: more would only share the device.
 * A narrow model's weights are small (tiny-embed's 17 MB), so the copies cost little.
 *
 * docs/tuning.md (Model instances) has the measurements.
 */
export function autoModelInstances(device: 'cpu' | 'cuda', intraOpThreads: number, hiddenSize: number): number {
  if (device !== 'cpu' || intraOpThreads !== 0 || autoIntraOpThreads(hiddenSize) > 1) return 1;
  return Math.max(1, Math.min(AUTO_INSTANCES_MAX, availableParallelism()));
}
