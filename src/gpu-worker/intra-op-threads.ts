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
 * Measured on the 2-core VM, 2026-12-03, three servers side by side (1 and 2
 * threads, and the transformers.js peer, whose onnxruntime runs one thread
 * here), wrk, 3 alternating rounds, medians: tiny-embed (hidden 128) with one
 * thread took 0.72-0.78x the CPU per request of two at 4 to 64 connections, and
 * 1.25x the req/s at 4 (3071 against 2465), the same at 16 and 64; alone, a
 * run of 8 or 32 rows took 1.2-1.4x less wall time on two threads but 1.5-2x
 * the CPU, and a row alone was slower on two (257 against 201 µs). minilm-l6
 * (hidden 384) is the other way: two threads 1.4x the req/s at 16 and 64
 * connections (306 against 216, 327 against 247), its runs 1.5x faster.
 * With one connection two threads answer sooner either way (tiny-embed 1790
 * against 1452 req/s, for 1.22x the CPU): --intra-op-threads 2 for that.
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
 * Measured on the 2-core VM: see docs/tuning.md (Model instances).
 */
export function autoModelInstances(device: 'cpu' | 'cuda', intraOpThreads: number, hiddenSize: number): number {
  if (device !== 'cpu' || intraOpThreads !== 0 || autoIntraOpThreads(hiddenSize) > 1) return 1;
  return Math.max(1, Math.min(AUTO_INSTANCES_MAX, availableParallelism()));
}
