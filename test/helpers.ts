/**
 * Shared test helpers: fresh random inputs and an unbatched, unpadded
 * onnxruntime reference to compare the engine's batched results against.
 */
import { readFileSync, statSync, watch } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { pack, unpack } from 'msgpackr';
import * as ort from 'onnxruntime-node';
import { expect } from 'vitest';
import WebSocket from 'ws';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { checkNativeBinaries } from '../dist/src/main/native-binaries.js';
import { mulberry32 } from '../dist/models/generator/rng.js';
import { SERVER_DEFAULTS, type ServerConfig } from '../dist/src/main/server.js';
import { loadModelSpec, type ModelSpec } from '../dist/src/shared/model-format/model-config.js';

export const modelsDir = fileURLToPath(new URL('../models', import.meta.url));

/**
 * Whether the servers this process starts serve with uWebSockets.js 20.57 (the build for glibc >= 2.38)
 * rather than 20.30 (Debian 12, CI): the servers' own start-up check, asked here (src/main/native-binaries.ts).
 * Where uWS's own parser answers, the two differ (docs/security.md), and tests assert each one's.
 */
export const NEWER_UWS = (await checkNativeBinaries({ gateways: true })).package === '@btc-vision/uwebsockets.js';

/** A seeded generator; each run draws a fresh seed (printed, so a failure can be replayed with SLABSERVE_TEST_SEED). */
export function makeRandom(label: string): () => number {
  const seed = Number(process.env.SLABSERVE_TEST_SEED ?? Math.floor(Math.random() * 2 ** 31));
  console.log(`${label}: seed ${seed}`);
  return mulberry32(seed);
}

/** Whole words of the model's vocabulary (no ## pieces, no specials). */
export function vocabularyWords(spec: ModelSpec): string[] {
  const tok = JSON.parse(readFileSync(spec.tokenizerPath, 'utf8')) as { model: { vocab: Record<string, number> } };
  return Object.keys(tok.model.vocab).filter((w) => /^[a-z]{2,}$/.test(w));
}

export function randomTexts(rand: () => number, words: string[], count: number, maxWords: number): string[] {
  return Array.from({ length: count }, () => {
    const n = 1 + Math.floor(rand() * maxWords);
    return Array.from({ length: n }, () => words[Math.floor(rand() * words.length)]).join(' ');
  });
}

/** Random token sequences with [CLS] ... [SEP], lengths in [minLen, maxLen]. */
export function randomTokenSequences(rand: () => number, count: number, minLen: number, maxLen: number) {
  return Array.from({ length: count }, () => {
    const len = minLen + Math.floor(rand() * (maxLen - minLen + 1));
    const ids = new Int32Array(len);
    ids[0] = 101;
    for (let i = 1; i < len - 1; i++) ids[i] = 1000 + Math.floor(rand() * 28000);
    ids[len - 1] = 102;
    return { ids, typeIds: new Int32Array(len) };
  });
}

/**
 * The row the server returns for one input (a slot's outputs side by side),
 * computed independently: the model's unmodified graph run on that input
 * alone, unpadded, and the post-processing done here, in float64, not by the
 * server's appended graph (graph.ts):
 *
 *   embed     [embedding (pooled as the model says: mean or cls; L2-normalised), its norm]
 *   classify  [softmax(logits), logits]
 *   rerank    [sigmoid(logit), logit]
 */
export class Reference {
  readonly spec: ModelSpec;
  private constructor(private readonly plain: PlainReference) {
    this.spec = plain.spec;
  }

  static async open(name: string): Promise<Reference> {
    return new Reference(await PlainReference.open(name));
  }

  private readonly textRows = new Map<string, Float32Array>();

  /** The slot row for `text` as `tok` encodes it (cached: tests often check the same text twice). */
  async rowOfText(tok: { encode(text: string, o: { maxLength: number; truncate: boolean }): { ids: Int32Array; typeIds: Int32Array } }, text: string, truncate = false): Promise<Float32Array> {
    const key = `${truncate}\0${text}`;
    let row = this.textRows.get(key);
    if (!row) {
      const enc = tok.encode(text, { maxLength: this.spec.maxLength, truncate });
      row = await this.row(enc.ids, enc.typeIds);
      this.textRows.set(key, row);
    }
    return row;
  }

  /**
   * The slot row the server would return for these ids. `mask` (default all 1)
   * is fed to the graph as its attention mask, and the pooling counts the
   * tokens it keeps.
   */
  async row(ids: ArrayLike<number>, typeIds?: ArrayLike<number>, mask?: ArrayLike<number>): Promise<Float32Array> {
    const n = ids.length;
    const kept = (t: number) => (mask ? mask[t]! : 1);
    const out = await this.plain.raw(ids, typeIds, mask); // token states [n, hidden], or the logits
    const spec = this.spec;
    if (spec.task === 'embed') {
      const hidden = out.length / n;
      const pooled = new Float64Array(hidden);
      if (spec.pooling === 'cls') for (let h = 0; h < hidden; h++) pooled[h] = out[h]!;
      else if (spec.pooling === 'mean') {
        let count = 0;
        for (let t = 0; t < n; t++) {
          if (!kept(t)) continue;
          count++;
          for (let h = 0; h < hidden; h++) pooled[h]! += out[t * hidden + h]!;
        }
        for (let h = 0; h < hidden; h++) pooled[h]! /= Math.max(count, 1e-9);
      } else throw new Error(`Reference: pooling ${spec.pooling} is not modelled here (st-folders.test.ts has every mode)`);
      const norm = Math.hypot(...pooled);
      const row = new Float32Array(hidden + 1);
      for (let h = 0; h < hidden; h++) row[h] = pooled[h]! / Math.max(norm, 1e-12);
      row[hidden] = norm;
      return row;
    }
    const head = spec.task === 'rerank' ? [sigmoid(out[0]!)] : Array.from(softmax(out));
    return Float32Array.from([...head, ...out]);
  }

  async close(): Promise<void> {
    await this.plain.close();
  }
}

/** A model's Reference, its served tokenizer and its vocabulary's words: what a test comparing rows with the reference opens first. */
export async function openReference(name: string): Promise<{ ref: Reference; tok: TextTokenizer; words: string[] }> {
  const ref = await Reference.open(name);
  return { ref, tok: await loadTokenizer(ref.spec.tokenizerPath), words: vocabularyWords(ref.spec) };
}

export function maxAbsDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  if (a.length !== b.length) return Infinity;
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i]! - b[i]!));
  return d;
}

/**
 * A server config for tests: loopback, a free port, CPU, one gateway, quiet, no result cache
 * (these tests send the same texts again and mean the device to run them: test/cache-server.test.ts
 * turns it on); `over` changes the rest.
 */
export function testServerConfig(over: Partial<ServerConfig> = {}): ServerConfig {
  // A fixed port puts gRPC on the default 8081, which every such server in the suite would share
  // (SO_REUSEPORT): off unless the test names its gRPC port. (Port 0 gives gRPC a free port too.)
  const grpcOff = over.port !== undefined && over.port !== 0 && over.grpcPort === undefined;
  return {
    ...(grpcOff ? { grpcPort: 0 } : {}),
    ...SERVER_DEFAULTS,
    host: '127.0.0.1',
    port: 0,
    device: 'cpu',
    models: ['tiny-embed', 'tiny-intent'],
    gatewayThreads: 1,
    cacheMb: 0,
    batching: {},
    log: () => {},
    ...over,
  };
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Polls `read` until `ok`; bounded, so a state that never comes fails with what was last seen (through `show`). */
export async function eventually<T>(what: string, read: () => Promise<T>, ok: (v: T) => boolean, limitMs = 20_000, show: (v: T) => unknown = (v) => v): Promise<T> {
  const deadline = Date.now() + limitMs;
  for (;;) {
    const v = await read();
    if (ok(v)) return v;
    if (Date.now() > deadline) throw new Error(`${what}: never happened; last seen ${JSON.stringify(show(v))?.slice(0, 2000)}`);
    await sleep(10);
  }
}

/**
 * Resolves once the file at `path` has a size `ok` accepts (-1: not there), looked at whenever its
 * folder changes (inotify: another process writing it), never on a timer; bounded, so a file that
 * never gets there fails with `what`. The folder must exist.
 */
export function whenFileSize(path: string, ok: (size: number) => boolean, what: string, limitMs = 30_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const sizeNow = () => {
      try {
        return statSync(path).size;
      } catch {
        return -1;
      }
    };
    const stop = () => {
      watcher.close();
      clearTimeout(limit);
    };
    const look = () => {
      if (!ok(sizeNow())) return;
      stop();
      resolve();
    };
    const watcher = watch(dirname(path), look);
    const limit = setTimeout(() => {
      stop();
      reject(new Error(`${what}: not within ${limitMs} ms (size ${sizeNow()})`));
    }, limitMs);
    look();
  });
}

/**
 * Checks one /predict answer's shape (every label once, sorted by score,
 * highest first) and returns its scores by class id.
 */
export function scoresByClassId(got: { label: string; score: number }[], labels: readonly string[]): Float32Array {
  expect(got).toHaveLength(labels.length);
  expect(got.map((g) => g.label).sort()).toEqual([...labels].sort());
  for (let i = 1; i < got.length; i++) expect(got[i - 1]!.score).toBeGreaterThanOrEqual(got[i]!.score);
  const out = new Float32Array(labels.length);
  for (const g of got) out[labels.indexOf(g.label)] = g.score;
  return out;
}

// ------------------------------------------------------------------ the independent reference

export const sigmoid = (x: number) => 1 / (1 + Math.exp(-x));

/** Softmax computed here, in float64 (the maximum subtracted first). */
export function softmax(logits: ArrayLike<number>): Float64Array {
  const top = Math.max(...Array.from(logits));
  const e = Float64Array.from(logits, (x) => Math.exp(x - top));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / sum);
}

/**
 * The independent reference of the project's standard: a plain onnxruntime
 * session of the model folder's unmodified model.onnx (not the graph the
 * server prepares from it), one input at a time, unpadded ([1, n], mask all
 * ones), its raw output finished by this code: last_hidden_state mean-pooled
 * over the n tokens and L2-normalised, logits through softmax (classify) or
 * sigmoid (rerank).
 */
export class PlainReference {
  readonly spec: ModelSpec;
  private constructor(
    spec: ModelSpec,
    private readonly session: ort.InferenceSession,
  ) {
    this.spec = spec;
  }

  /** `nameOrDir`: a model under models/, or a model folder's path. */
  static async open(nameOrDir: string): Promise<PlainReference> {
    const dir = nameOrDir.includes('/') ? nameOrDir : join(modelsDir, nameOrDir);
    const spec = loadModelSpec(dir);
    const session = await ort.InferenceSession.create(readFileSync(join(dir, 'model.onnx')), { executionProviders: ['cpu'], intraOpNumThreads: 1 });
    return new PlainReference(spec, session);
  }

  /** The graph's one output for one input alone: [n, hidden] token states flattened, or the logits. `mask` (default all 1) is its attention mask. */
  async raw(ids: ArrayLike<number>, typeIds?: ArrayLike<number>, mask?: ArrayLike<number>): Promise<Float32Array> {
    const n = ids.length;
    const i64 = (f: (i: number) => number) => new ort.Tensor('int64', BigInt64Array.from({ length: n }, (_, i) => BigInt(f(i))), [1, n]);
    const feeds: Record<string, ort.Tensor> = { input_ids: i64((i) => ids[i]!), attention_mask: i64((i) => (mask ? mask[i]! : 1)) };
    if (this.session.inputNames.includes('token_type_ids')) feeds.token_type_ids = i64((i) => (typeIds ? typeIds[i]! : 0));
    const out = await this.session.run(feeds);
    const name = this.session.outputNames.includes('last_hidden_state') ? 'last_hidden_state' : 'logits';
    return Float32Array.from(out[name]!.data as Float32Array);
  }

  /** Mean of the n token states (float64 sums), L2-normalised unless `normalize` is false. */
  async embedding(ids: ArrayLike<number>, normalize = true): Promise<Float64Array> {
    const states = await this.raw(ids);
    const n = ids.length;
    const hidden = states.length / n;
    const row = new Float64Array(hidden);
    for (let t = 0; t < n; t++) for (let h = 0; h < hidden; h++) row[h]! += states[t * hidden + h]!;
    for (let h = 0; h < hidden; h++) row[h]! /= n;
    if (!normalize) return row;
    const norm = Math.hypot(...row);
    return row.map((v) => v / Math.max(norm, 1e-12));
  }

  /** A classifier's logits and their softmax. */
  async classification(ids: ArrayLike<number>, typeIds?: ArrayLike<number>): Promise<{ logits: Float32Array; probabilities: Float64Array }> {
    const logits = await this.raw(ids, typeIds);
    return { logits, probabilities: softmax(logits) };
  }

  /** A reranker's single logit for a (query, text) pair's ids, and its sigmoid. */
  async rerank(ids: ArrayLike<number>, typeIds: ArrayLike<number>): Promise<{ logit: number; score: number }> {
    const logits = await this.raw(ids, typeIds);
    if (logits.length !== 1) throw new Error(`a reranker has one logit, this graph gives ${logits.length}`);
    return { logit: logits[0]!, score: sigmoid(logits[0]!) };
  }

  async close(): Promise<void> {
    await this.session.release();
  }
}

/** One frame sent on a fresh /ws socket of the server on `port`, and its first answer (msgpack), decoded; the socket closed after. */
export async function wsRequest(port: number, frame: Record<string, unknown>): Promise<any> {
  const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`);
  try {
    await new Promise<void>((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    const answer = new Promise<any>((resolve, reject) => {
      ws.once('message', (data: Buffer) => resolve(unpack(data)));
      ws.once('close', () => reject(new Error('closed before an answer')));
    });
    ws.send(pack(frame));
    return await answer;
  } finally {
    ws.close();
  }
}

/**
 * Runs a BERT graph as exported and a rewritten copy of it (fusion tests) on the same right-padded
 * batches of random ids (seeded by `label`, printed), and expects their token states
 * (last_hidden_state) within `tolerance` of each other.
 */
export async function expectSameTokenStates(exported: Uint8Array, rewritten: Uint8Array, label: string, tolerance = 1e-5): Promise<void> {
  // Errors only: a rewritten graph may leave initializers unused, and onnxruntime warns of each.
  const open = (bytes: Uint8Array) => ort.InferenceSession.create(bytes, { executionProviders: ['cpu'], intraOpNumThreads: 1, logSeverityLevel: 3 });
  const [plain, fused] = await Promise.all([open(exported), open(rewritten)]);
  try {
    const r = makeRandom(label);
    for (const B of [1, 3, 8]) {
      const T = 5 + Math.floor(r() * 36);
      const ids = new BigInt64Array(B * T);
      const mask = new BigInt64Array(B * T);
      for (let b = 0; b < B; b++) {
        const len = 2 + Math.floor(r() * (T - 1)); // right-padded rows, as the server builds them
        for (let t = 0; t < len; t++) {
          ids[b * T + t] = BigInt(t === 0 ? 101 : 1000 + Math.floor(r() * 29000));
          mask[b * T + t] = 1n;
        }
      }
      const feeds = { input_ids: new ort.Tensor('int64', ids, [B, T]), attention_mask: new ort.Tensor('int64', mask, [B, T]), token_type_ids: new ort.Tensor('int64', new BigInt64Array(B * T), [B, T]) };
      const [a, f] = await Promise.all([plain.run(feeds), fused.run(feeds)]);
      const states = (o: ort.InferenceSession.OnnxValueMapType) => o.last_hidden_state!.data as Float32Array;
      expect(maxAbsDiff(states(a), states(f)), `B=${B} T=${T}`).toBeLessThan(tolerance);
    }
  } finally {
    await Promise.all([plain.release(), fused.release()]);
  }
}
