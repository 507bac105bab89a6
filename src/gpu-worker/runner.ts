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
import { availableParallelism } from 'node:os';
import * as ort from 'onnxruntime-node';
import type { ModelSpec } from '../shared/model-config.js';
import { H_LENGTH, type Slab } from '../shared/slab.js';
import { prepareModel, type PreparedModel } from './graph.js';
import type { DeviceInfo } from './device.js';
import { batchCapacity, type BatchingOptions } from './scheduler.js';

export interface SessionOptions {
  /** onnxruntime intra-op threads; 0: {@link autoIntraOpThreads}. */
  intraOpThreads: number;
}

/**
 * Intra-op threads when 0 is asked: every core. They sleep between runs
 * (NO_SPINNING), so they take only the CPU the gateways leave idle. Measured
 * on 2 cores against one thread, two servers side by side: minilm-l6 at 16
 * HTTP clients 1.25-1.4x the req/s; tiny-embed 1.2x over WebSocket (64 in
 * flight), 1.15-1.2x at one client (P50 1.6 against 1.9 ms), equal over HTTP
 * at 64 clients (0.97-1.10 by round), where the gateway has no CPU to spare.
 */
export function autoIntraOpThreads(): number {
  return Math.max(1, availableParallelism());
}

/**
 * Pool threads that wait for work sleep instead of spinning. onnxruntime's
 * default spins them between runs: on 2 cores its one pool thread burned a
 * whole core (1999 ms of CPU in 2000 ms of single-row runs 1 ms apart) that
 * the gateway needed; asleep, 336 ms.
 */
const NO_SPINNING = { session: { intra_op: { allow_spinning: '0' }, inter_op: { allow_spinning: '0' } } };

/** Padded input tensors for one bucket shape, reused batch after batch. */
class InputBuffers {
  readonly ids: BigInt64Array | Int32Array;
  readonly mask: BigInt64Array | Int32Array;
  readonly types: BigInt64Array | Int32Array;
  /** int32 views of the above; int64 values are written as (low word, 0). */
  readonly ids32: Int32Array;
  readonly mask32: Int32Array;
  readonly types32: Int32Array;
  readonly stride: 1 | 2;

  constructor(elems: number, type: 'int64' | 'int32') {
    const make = () => (type === 'int64' ? new BigInt64Array(elems) : new Int32Array(elems));
    this.ids = make();
    this.mask = make();
    this.types = make();
    this.stride = type === 'int64' ? 2 : 1;
    const view = (a: BigInt64Array | Int32Array) => new Int32Array(a.buffer, a.byteOffset, elems * this.stride);
    this.ids32 = view(this.ids);
    this.mask32 = view(this.mask);
    this.types32 = view(this.types);
  }
}

export interface BatchStats {
  rows: number;
  realTokens: number;
  paddedTokens: number;
  runMs: number;
}

export class ModelRunner {
  readonly spec: ModelSpec;
  readonly slab: Slab;
  readonly options: BatchingOptions;
  private readonly session: ort.InferenceSession;
  private readonly prepared: PreparedModel;
  /** Free input-buffer sets per bucket index (one per batch that may be in flight). */
  private readonly pools: InputBuffers[][];
  /** padTo resolved for this device ('auto': the longest input on CPU, the bucket on CUDA). */
  readonly padToLongest: boolean;

  private constructor(
    spec: ModelSpec,
    slab: Slab,
    options: BatchingOptions,
    session: ort.InferenceSession,
    prepared: PreparedModel,
    inflight: number,
    device: DeviceInfo,
  ) {
    this.padToLongest = options.padTo === 'longest' || (options.padTo === 'auto' && device.kind !== 'cuda');
    this.spec = spec;
    this.slab = slab;
    this.options = options;
    this.session = session;
    this.prepared = prepared;
    this.pools = options.buckets.map((len) =>
      Array.from({ length: inflight }, () => new InputBuffers(batchCapacity(options, len) * len, prepared.inputType)),
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
    const prepared = prepareModel(readFileSync(spec.onnxPath), spec);
    const providers: ort.InferenceSession.ExecutionProviderConfig[] =
      device.kind === 'cuda' ? [{ name: 'cuda', deviceId: device.id }] : ['cpu'];
    const sess = await ort.InferenceSession.create(prepared.bytes, {
      executionProviders: providers,
      graphOptimizationLevel: 'all',
      intraOpNumThreads: session.intraOpThreads === 0 ? autoIntraOpThreads() : session.intraOpThreads,
      extra: NO_SPINNING,
      logSeverityLevel: 3,
    });
    return new ModelRunner(spec, slab, options, sess, prepared, maxInflight, device);
  }

  /**
   * Runs the requests in `slots` (all in bucket `bucket`) as one padded batch
   * and writes each result row into its slot. Throws if the run fails; the
   * caller decides what the slots become.
   */
  async run(slots: readonly number[], bucket: number): Promise<BatchStats> {
    const T = this.padToLongest ? this.longest(slots) : this.options.buckets[bucket]!;
    const pool = this.pools[bucket]!;
    const buf = pool.pop();
    if (!buf) throw new Error('no free input buffer: more batches in flight than configured');
    try {
      const realTokens = this.fill(buf, slots, T);
      const B = slots.length;
      const type = this.prepared.inputType;
      const feeds: Record<string, ort.Tensor> = {
        input_ids: new ort.Tensor(type, buf.ids.subarray(0, B * T), [B, T]),
        attention_mask: new ort.Tensor(type, buf.mask.subarray(0, B * T), [B, T]),
      };
      if (this.prepared.hasTokenTypeIds) feeds.token_type_ids = new ort.Tensor(type, buf.types.subarray(0, B * T), [B, T]);
      const started = performance.now();
      const out = await this.session.run(feeds, this.prepared.outputs.map((o) => o.name));
      const runMs = performance.now() - started;
      this.scatter(out, slots);
      return { rows: B, realTokens, paddedTokens: B * T, runMs };
    } finally {
      pool.push(buf);
    }
  }

  /** The longest input among `slots` (never more than their bucket's length). */
  private longest(slots: readonly number[]): number {
    let T = 1;
    for (const slot of slots) T = Math.max(T, this.slab.header(slot, H_LENGTH));
    return T;
  }

  /** Copies each slot's tokens into row r of the padded buffers; returns the real token count. */
  private fill(buf: InputBuffers, slots: readonly number[], T: number): number {
    const s = buf.stride;
    const { ids32, mask32, types32 } = buf;
    let real = 0;
    for (let r = 0; r < slots.length; r++) {
      const slot = slots[r]!;
      const len = this.slab.header(slot, H_LENGTH);
      const ids = this.slab.slotIds(slot);
      const types = this.slab.slotTypeIds(slot);
      let at = r * T * s;
      for (let t = 0; t < len; t++, at += s) {
        ids32[at] = ids[t]!;
        mask32[at] = 1;
        types32[at] = types[t]!;
      }
      for (let t = len; t < T; t++, at += s) {
        ids32[at] = 0;
        mask32[at] = 0;
        types32[at] = 0;
      }
      real += len;
    }
    return real;
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

  /**
   * Runs every bucket shape at its largest batch, so no request pays for
   * first-run allocation, then times one row and a quarter of the capacity:
   * two points that seed the cost model (the first, untimed run would
   * overstate the cost several times over).
   */
  async warmUp(): Promise<{ bucket: number; rows: number; ms: number }[]> {
    const timings: { bucket: number; rows: number; ms: number }[] = [];
    for (let b = 0; b < this.options.buckets.length; b++) {
      const T = this.options.buckets[b]!;
      const capacity = batchCapacity(this.options, T);
      for (const [B, timed] of [[capacity, false], [1, true], [Math.max(2, Math.ceil(capacity / 4)), true]] as const) {
        const type = this.prepared.inputType;
        const make = (v: number) => (type === 'int64' ? new BigInt64Array(B * T).fill(BigInt(v)) : new Int32Array(B * T).fill(v));
        const feeds: Record<string, ort.Tensor> = {
          input_ids: new ort.Tensor(type, make(100), [B, T]),
          attention_mask: new ort.Tensor(type, make(1), [B, T]),
        };
        if (this.prepared.hasTokenTypeIds) feeds.token_type_ids = new ort.Tensor(type, make(0), [B, T]);
        const started = performance.now();
        await this.session.run(feeds);
        if (timed) timings.push({ bucket: b, rows: B, ms: performance.now() - started });
      }
    }
    return timings;
  }

  async release(): Promise<void> {
    await this.session.release();
  }
}
