/**
 * One model on one device: its onnxruntime session, its preallocated padded
 * input buffers (one set per bucket shape and per batch in flight), and the
 * copy of results back into the slab.
 *
 * A batch is copied exactly once: from the slots' token ids into the padded
 * [batch, bucket] input buffers. Padding positions get token id 0 and
 * attention mask 0, so the graph ignores them.
 */
import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import * as ort from 'onnxruntime-node';
import type { ModelSpec } from '../shared/model-format/model-config.js';
import { H_ATTENDED, H_LENGTH, H_POOL_FROM, H_TOKEN_PAGE, type Slab } from '../shared/slab.js';
import { POOLING_MASK, prepareModel, type GraphFusions, type PreparedModel } from './graph.js';
import type { DeviceInfo } from './device.js';
import { intraOpThreadsFor } from './intra-op-threads.js';
import type { NativeGate } from '../shared/native-gate.js';
import { batchCapacity, type BatchingOptions } from './scheduler.js';

export interface SessionOptions {
  /** onnxruntime intra-op threads; 0: {@link autoIntraOpThreads} (intra-op-threads.ts). */
  intraOpThreads: number;
  /**
   * The calling thread's native gate (shared/native-gate.ts): every onnxruntime call of the
   * session (create, run, release) goes through it, so its thread is never terminated inside one.
   */
  gate: NativeGate;
}


/**
 * On CPU, pool threads spin while a run lasts and sleep between runs
 * (force_spinning_stop ends the spin when a run returns). onnxruntime's
 * default spins them between runs too: with runs a millisecond apart its pool
 * thread burns a whole core, on a small machine the core the gateway needs.
 * Never spinning, every parallel section of a run waits for a sleeping thread
 * to wake: a one-row run takes markedly longer for the same CPU, and a lone
 * client waits longer for its answer. A thread spinning through a run still
 * holds a core a gateway may need under load, so the pool runs at a lower
 * priority (--intra-op-nice, src/gpu-worker/thread.ts), which gives most of
 * that back (docs/tuning.md, CPU threads, has the figures). On CUDA the pool
 * has next to nothing to do while the device computes, and spinning would
 * only burn the cores.
 */
const INTRA_OP_SPINNING = { session: { intra_op: { allow_spinning: '1' }, inter_op: { allow_spinning: '0' }, force_spinning_stop: '1' } };
const NO_SPINNING = { session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } };

/**
 * onnxruntime's CPU memory arena is off. With it, each session keeps the
 * largest working set it has ever run, for good: after a warm-up at capacity
 * that is several times the RSS the models need, and the arena makes a batch
 * no faster (docs/tuning.md, Memory, has the figures). What a run allocates
 * goes back to malloc when it ends, and {@link CPU_RUN_TOKENS} keeps that small.
 */
const SESSION_MEMORY = { enableCpuMemArena: false } as const;

/**
 * A SPLADE graph is the exception: its masked-LM logits are [B,T,30522], 125 MB
 * for one run of CPU_RUN_TOKENS, and without the arena each run allocates and
 * faults in such tensors afresh, several times slower a row than with it
 * (docs/tuning.md, Memory, has the figures). So its session keeps the
 * arena, and its runs are cut to {@link SPLADE_RUN_TOKENS} to bound what the
 * arena keeps (a few tensors of 256 x 30522 floats, 31 MB each).
 */
export const SPLADE_RUN_TOKENS = 256;

/**
 * Most padded tokens in one onnxruntime run on CPU: a larger batch runs as
 * consecutive runs of at most this many tokens (at least one row each), its
 * rows grouped longest first when padding to the longest. A CPU gains nothing
 * from bigger runs (a batch of long rows even runs faster split, and client
 * batches of short texts serve as many requests or more: docs/tuning.md,
 * Memory, has the figures), and the memory a run needs grows with its tokens
 * (and with the square of its length): this bounds it, whatever
 * --max-batch-tokens allows a batch. On CUDA a batch is one run.
 */
export const CPU_RUN_TOKENS = 1024;

/** A prepared model without its bytes. */
type PreparedIo = Omit<PreparedModel, 'bytes'>;

/** Padded input tensors for one bucket shape, reused batch after batch. */
class InputBuffers {
  readonly ids: BigInt64Array | Int32Array;
  readonly mask: BigInt64Array | Int32Array;
  readonly types: BigInt64Array | Int32Array;
  /** Where the graph takes position_ids: 0..T-1 on every row (batches are right-padded), for the T of positionsT. */
  readonly positions: BigInt64Array | Int32Array | null;
  private positionsT = 0;
  /** Where the pooling has its own mask (include_prompt false): the attention mask less each row's H_POOL_FROM first tokens. */
  readonly poolingMask: BigInt64Array | Int32Array | null;
  /** int32 views of the above; int64 values are written as (low word, 0). */
  readonly ids32: Int32Array;
  readonly mask32: Int32Array;
  readonly types32: Int32Array;
  readonly poolingMask32: Int32Array | null;
  readonly stride: 1 | 2;

  constructor(elems: number, type: 'int64' | 'int32', io: Pick<PreparedIo, 'hasPositionIds' | 'hasPoolingMask'>) {
    const make = () => (type === 'int64' ? new BigInt64Array(elems) : new Int32Array(elems));
    this.ids = make();
    this.mask = make();
    this.types = make();
    this.stride = type === 'int64' ? 2 : 1;
    this.positions = io.hasPositionIds ? make() : null;
    this.poolingMask = io.hasPoolingMask ? make() : null;
    const view = (a: BigInt64Array | Int32Array) => new Int32Array(a.buffer, a.byteOffset, elems * this.stride);
    this.ids32 = view(this.ids);
    this.mask32 = view(this.mask);
    this.types32 = view(this.types);
    this.poolingMask32 = this.poolingMask && view(this.poolingMask);
  }

  /** position_ids for rows of length T (a run pads to its own longest, so T changes): rewritten only when it does. */
  positionsFor(T: number): BigInt64Array | Int32Array {
    const positions = this.positions!;
    if (this.positionsT !== T) {
      const p32 = new Int32Array(positions.buffer, positions.byteOffset, positions.length * this.stride);
      for (let i = 0; i < positions.length; i++) p32[i * this.stride] = i % T;
      this.positionsT = T;
    }
    return positions;
  }
}

/** The first `elems` tokens of `buf` as warm-up input: id 100, attended and pooled, type 0. */
function fillConstant(buf: InputBuffers, elems: number): void {
  for (let i = 0, at = 0; i < elems; i++, at += buf.stride) {
    buf.ids32[at] = 100;
    buf.mask32[at] = 1;
    buf.types32[at] = 0;
    if (buf.poolingMask32) buf.poolingMask32[at] = 1;
  }
}

export interface BatchStats {
  rows: number;
  realTokens: number;
  paddedTokens: number;
  runMs: number;
}

/** An onnxruntime session for a prepared graph, with the runner's options (threads, spinning, arena). */
function openSession(bytes: Uint8Array, spec: ModelSpec, device: DeviceInfo, session: SessionOptions): Promise<ort.InferenceSession> {
  const providers: ort.InferenceSession.ExecutionProviderConfig[] = device.kind === 'cuda' ? [{ name: 'cuda', deviceId: device.id }] : ['cpu'];
  return session.gate.run(() => ort.InferenceSession.create(bytes, {
    executionProviders: providers,
    graphOptimizationLevel: 'all',
    intraOpNumThreads: intraOpThreadsFor(session.intraOpThreads, spec.hiddenSize),
    extra: withGraphFolder(device.kind === 'cpu' ? INTRA_OP_SPINNING : NO_SPINNING, dirname(spec.onnxPath)),
    ...(spec.pooling === 'splade' ? {} : SESSION_MEMORY),
    logSeverityLevel: 3,
  }));
}

/**
 * The session's extra settings, and the folder of the graph: the session is made from the prepared
 * graph's bytes, so a graph with external data (model.onnx_data) is read from where its file was.
 */
function withGraphFolder(extra: { session: object }, folder: string): { session: object } {
  return { session: { ...extra.session, model_external_initializers_file_folder_path: folder } };
}

export class ModelRunner {
  readonly spec: ModelSpec;
  readonly slab: Slab;
  readonly options: BatchingOptions;
  private readonly session: ort.InferenceSession;
  /** Every call into the session goes through it (SessionOptions.gate). */
  private readonly gate: NativeGate;
  /** What the runs need of the prepared model; not its bytes (onnxruntime holds its own copy of the weights). */
  private readonly prepared: PreparedIo;
  /** Free input-buffer sets per bucket index (one per batch that may be in flight). */
  private readonly pools: InputBuffers[][];
  /** The outputs a run fetches: the pooled rows, and with the token vectors when an input asked for them. */
  private readonly fetches: { rows: string[]; withTokens: string[] };
  /** padTo resolved for this device ('auto': the longest input on CPU, the bucket on CUDA). */
  readonly padToLongest: boolean;
  private readonly onCuda: boolean;

  private constructor(
    spec: ModelSpec,
    slab: Slab,
    options: BatchingOptions,
    session: ort.InferenceSession,
    gate: NativeGate,
    prepared: PreparedIo,
    inflight: number,
    device: DeviceInfo,
  ) {
    this.onCuda = device.kind === 'cuda';
    this.padToLongest = options.padTo === 'longest' || (options.padTo === 'auto' && !this.onCuda);
    this.spec = spec;
    this.slab = slab;
    this.options = options;
    this.session = session;
    this.gate = gate;
    this.prepared = prepared;
    const rows = prepared.outputs.map((o) => o.name);
    this.fetches = { rows, withTokens: prepared.tokenOutput ? [...rows, prepared.tokenOutput.name] : rows };
    this.pools = options.buckets.map((len) =>
      Array.from({ length: inflight }, () => new InputBuffers(batchCapacity(options, len) * len, prepared.inputType, prepared)),
    );
  }

  static async create(
    spec: ModelSpec,
    slab: Slab,
    options: BatchingOptions,
    device: DeviceInfo,
    session: SessionOptions,
    maxInflight: number,
  ): Promise<ModelRunner> {
    // The file and the serialized model (17.5 MB each for a tiny model) are garbage once the session
    // holds the weights: only their input and output facts are kept.
    const source = readFileSync(spec.onnxPath);
    const runnerOf = async ({ bytes, ...prepared }: PreparedModel) =>
      new ModelRunner(spec, slab, options, await openSession(bytes, spec, device, session), session.gate, prepared, maxInflight, device);
    const fused = prepareModel(source, spec);
    if (!fused.rewritten) return runnerOf(fused);
    // The fused graph's one unknown is the ranks its fused ops want (SkipLayerNormalization 2 or 3,
    // Attention 3): one run tells. Where it fails, the unmodified graph serves.
    let runner: ModelRunner | undefined;
    try {
      runner = await runnerOf(fused);
      await runner.probe();
      return runner;
    } catch {
      await runner?.release();
      return runnerOf(prepareModel(source, spec, { fuse: false }));
    }
  }

  /** What this runner's graph runs fused (fusion.ts, attention-fusion.ts); all 0: the unmodified graph. */
  get fusions(): GraphFusions {
    return this.prepared.fusions;
  }

  /** One run of one row of the shortest bucket: throws where the graph cannot run. */
  private async probe(): Promise<void> {
    const T = this.options.buckets[0]!;
    const buf = this.pools[0]![0]!;
    fillConstant(buf, T);
    await this.gate.run(() => this.session.run(this.feeds(buf, 1, T), { logSeverityLevel: 4 })); // its failure is an answer, not an error to log
  }

  /**
   * Runs the requests in `slots` (all in bucket `bucket`) as one padded batch
   * (on CPU, as runs of at most {@link CPU_RUN_TOKENS} tokens) and writes each
   * result row into its slot. Throws if a run fails; the caller decides what
   * the slots become.
   */
  async run(slots: readonly number[], bucket: number): Promise<BatchStats> {
    const pool = this.pools[bucket]!;
    const buf = pool.pop();
    if (!buf) throw new Error('no free input buffer: more batches in flight than configured');
    try {
      const bucketLength = this.options.buckets[bucket]!;
      const length = (slot: number) => this.slab.header(slot, H_LENGTH);
      // Longest first, so that each run pads to its own longest input.
      const order = this.padToLongest && slots.length > 1 ? [...slots].sort((a, b) => length(b) - length(a)) : slots;
      const tokenOutput = this.prepared.tokenOutput;
      let realTokens = 0;
      let paddedTokens = 0;
      let runMs = 0;
      for (let at = 0; at < order.length; ) {
        const T = this.padToLongest ? Math.max(1, length(order[at]!)) : bucketLength;
        const part = order.slice(at, at + this.rowsPerRun(T, order.length));
        realTokens += this.fill(buf, part, T);
        // The token vectors leave onnxruntime only for a run holding an input that asked for them.
        const tokens = tokenOutput !== undefined && part.some((slot) => this.slab.header(slot, H_TOKEN_PAGE) > 0);
        const started = performance.now();
        const out = await this.gate.run(() => this.session.run(this.feeds(buf, part.length, T), tokens ? this.fetches.withTokens : this.fetches.rows));
        runMs += performance.now() - started;
        this.scatter(out, part);
        if (tokens) this.scatterTokens(out[tokenOutput.name]!.data as Float32Array, part, T, tokenOutput.width);
        paddedTokens += part.length * T;
        at += part.length;
      }
      return { rows: slots.length, realTokens, paddedTokens, runMs };
    } finally {
      pool.push(buf);
    }
  }

  /** Rows of `T` tokens in one onnxruntime run: all of them on CUDA, at most {@link CPU_RUN_TOKENS} tokens' worth on CPU. */
  private rowsPerRun(T: number, rows: number): number {
    const runTokens = this.spec.pooling === 'splade' ? SPLADE_RUN_TOKENS : CPU_RUN_TOKENS;
    return this.onCuda ? rows : Math.max(1, Math.min(rows, Math.floor(runTokens / T)));
  }

  /** The first `B` rows of `buf` as [B, T] input tensors. */
  private feeds(buf: InputBuffers, B: number, T: number): Record<string, ort.Tensor> {
    const type = this.prepared.inputType;
    const feeds: Record<string, ort.Tensor> = {
      input_ids: new ort.Tensor(type, buf.ids.subarray(0, B * T), [B, T]),
      attention_mask: new ort.Tensor(type, buf.mask.subarray(0, B * T), [B, T]),
    };
    if (this.prepared.hasTokenTypeIds) feeds.token_type_ids = new ort.Tensor(type, buf.types.subarray(0, B * T), [B, T]);
    if (buf.positions) feeds.position_ids = new ort.Tensor(type, buf.positionsFor(T).subarray(0, B * T), [B, T]);
    if (buf.poolingMask) feeds[POOLING_MASK] = new ort.Tensor(type, buf.poolingMask.subarray(0, B * T), [B, T]);
    return feeds;
  }

  /** Copies each slot's tokens into row r of the padded buffers; returns the real token count. */
  private fill(buf: InputBuffers, slots: readonly number[], T: number): number {
    const s = buf.stride;
    const { ids32, mask32, types32 } = buf;
    let real = 0;
    for (let r = 0; r < slots.length; r++) {
      const slot = slots[r]!;
      const len = this.slab.header(slot, H_LENGTH);
      const attended = this.slab.header(slot, H_ATTENDED) || len;
      const ids = this.slab.slotIds(slot);
      const types = this.slab.slotTypeIds(slot);
      let at = r * T * s;
      for (let t = 0; t < len; t++, at += s) {
        ids32[at] = ids[t]!;
        mask32[at] = t < attended ? 1 : 0;
        types32[at] = types[t]!;
      }
      for (let t = len; t < T; t++, at += s) {
        ids32[at] = 0;
        mask32[at] = 0;
        types32[at] = 0;
      }
      real += len;
    }
    if (buf.poolingMask32) this.fillPoolingMask(buf.poolingMask32, s, slots, T);
    return real;
  }

  /** Row r of the pooling mask: 1 on slot r's real tokens from its H_POOL_FROM on, 0 before and on padding. */
  private fillPoolingMask(mask32: Int32Array, s: 1 | 2, slots: readonly number[], T: number): void {
    for (let r = 0; r < slots.length; r++) {
      const len = this.slab.header(slots[r]!, H_LENGTH);
      const from = this.slab.header(slots[r]!, H_POOL_FROM);
      for (let t = 0, at = r * T * s; t < T; t++, at += s) mask32[at] = t >= from && t < len ? 1 : 0;
    }
  }

  /** Writes row r of every output into slot r's output region, outputs side by side. */
  private scatter(out: ort.InferenceSession.ReturnType, slots: readonly number[]): void {
    let offset = 0;
    for (const { name, width } of this.prepared.outputs) {
      const data = out[name]!.data as Float32Array;
      for (let r = 0; r < slots.length; r++) {
        this.slab.slotOutput(slots[r]!).set(data.subarray(r * width, r * width + width), offset);
      }
      offset += width;
    }
  }

  /** Copies each asking slot's real tokens' vectors (row r of [B, T, width]) into its page of the token area. */
  private scatterTokens(data: Float32Array, slots: readonly number[], T: number, width: number): void {
    for (let r = 0; r < slots.length; r++) {
      const slot = slots[r]!;
      const page = this.slab.header(slot, H_TOKEN_PAGE);
      if (page === 0) continue;
      const len = this.slab.header(slot, H_LENGTH);
      this.slab.pageTokens(page - 1, len).set(data.subarray(r * T * width, (r * T + len) * width));
    }
  }

  /**
   * Runs every bucket shape before the first request, and times one row and a
   * quarter of the capacity of each: two points that seed the cost model (the
   * scheduler's and admission's run-time predictions, refitted online from the
   * real batches), run as {@link run} runs them. Each bucket's first run is
   * untimed: a first run overstates the cost.
   *
   * On CUDA that first run is the bucket's largest batch, so the device's
   * arena is grown before a request needs it (and a batch that cannot fit in
   * device memory fails here, not in service). On CPU it is one row: without
   * onnxruntime's CPU arena nothing a run allocates outlives it, so a run at
   * capacity would warm nothing; it would only leave this thread's malloc
   * arena holding the largest working set at rest (the 512 bucket at its full
   * batch in one run) and add seconds to start-up.
   */
  async warmUp(): Promise<{ bucket: number; rows: number; ms: number }[]> {
    const timings: { bucket: number; rows: number; ms: number }[] = [];
    for (let b = 0; b < this.options.buckets.length; b++) {
      const T = this.options.buckets[b]!;
      const capacity = batchCapacity(this.options, T);
      const pool = this.pools[b]!;
      const buf = pool.pop()!; // no batch runs before warm-up ends: every buffer is free
      try {
        // Untimed first (on CUDA at capacity, to grow the device arena), then the cost model's two timed
        // points: one row, and a quarter of the capacity (at least 2 rows; none where only one fits).
        const runs: [rows: number, timed: boolean][] = [[this.onCuda ? capacity : 1, false], [1, true]];
        if (capacity >= 2) runs.push([Math.max(2, Math.ceil(capacity / 4)), true]);
        for (const [B, timed] of runs) {
          // A batch larger than one run (CPU_RUN_TOKENS) runs as identical runs one after another: one
          // of them, timed and scaled, is its cost. Running them all would only lengthen a large model's
          // warm-up.
          const per = this.rowsPerRun(T, B);
          fillConstant(buf, per * T);
          const started = performance.now();
          await this.gate.run(() => this.session.run(this.feeds(buf, per, T)));
          if (timed) timings.push({ bucket: b, rows: B, ms: ((performance.now() - started) * B) / per });
        }
      } finally {
        pool.push(buf);
      }
    }
    return timings;
  }

  async release(): Promise<void> {
    await this.gate.run(() => this.session.release());
  }
}
