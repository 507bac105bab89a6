/**
 * The request side of inference, shared by every owner thread (each gateway
 * thread, and the in-process engine): validate inputs, tokenize, submit one
 * slot per input through the slabs, and turn result rows into embeddings or
 * class scores. Transport-free: the HTTP layer and the engine both call it.
 */
import type { ModelPlan } from '../inference-host.js';
import { nowMs } from '../shared/clock.js';
import { ModelNotFoundError, ValidationError } from '../shared/errors.js';
import type { Task } from '../shared/model-config.js';
import type { SlabSubmitter, SlotResult } from '../shared/submitter.js';
import type { EncodeOptions, Encoding, TextTokenizer } from './tokenizer.js';

export interface ClientModel {
  plan: ModelPlan;
  tokenizer: TextTokenizer;
}

/** Tokenizes a list of texts off the event loop (a piscina pool); absent, batches are tokenized inline. */
export type BatchTokenizer = (model: ClientModel, texts: string[], opts: EncodeOptions) => Promise<Encoding[]>;

export interface CallOptions {
  signal?: AbortSignal;
  /** Ms from now after which a request still queued fails instead of running. */
  timeoutMs?: number;
}

export interface Timing {
  /** Longest any of the request's inputs waited for its batch, ms. */
  queueMs: number;
  /** Longest batch run among the request's inputs, ms. */
  inferenceMs: number;
}

export interface Classification {
  /** Most likely label and its probability. */
  label: string;
  score: number;
  /** Probability of every label, by class id. */
  probabilities: Float32Array;
  /** Raw logits, by class id. */
  logits: Float32Array;
}

export class InferenceClient {
  private readonly models: ClientModel[];
  private readonly submitter: SlabSubmitter;
  private readonly requestTimeoutMs: number;
  private readonly batchTokenizer: BatchTokenizer | undefined;
  /** Client batches at most this long (or this many characters) are tokenized inline. */
  private readonly inlineTokenizeChars: number;

  constructor(
    models: ClientModel[],
    submitter: SlabSubmitter,
    opts: { requestTimeoutMs: number; batchTokenizer?: BatchTokenizer; inlineTokenizeChars?: number },
  ) {
    this.models = models;
    this.submitter = submitter;
    this.requestTimeoutMs = opts.requestTimeoutMs;
    this.batchTokenizer = opts.batchTokenizer;
    this.inlineTokenizeChars = opts.inlineTokenizeChars ?? 1024;
  }

  list(): ClientModel[] {
    return this.models;
  }

  /** The named model, or the first of the right task; checks the task matches. */
  resolve(task: Task, name?: string): ClientModel {
    if (name !== undefined) {
      const m = this.byName(name);
      if (m.plan.spec.task !== task) throw new ValidationError(`model "${name}" is a ${m.plan.spec.task} model, not ${task}`);
      return m;
    }
    const m = this.models.find((x) => x.plan.spec.task === task);
    if (!m) throw new ModelNotFoundError(`(any ${task} model)`, this.names());
    return m;
  }

  byName(name: string): ClientModel {
    const m = this.models.find((x) => x.plan.spec.name === name);
    if (!m) throw new ModelNotFoundError(name, this.names());
    return m;
  }

  names(): string[] {
    return this.models.map((m) => m.plan.spec.name);
  }

  /** Validates and tokenizes texts: inline when small, on the batch tokenizer (if any) when large. */
  async encode(model: ClientModel, inputs: string | string[], truncate: boolean): Promise<Encoding[]> {
    const texts = typeof inputs === 'string' ? [inputs] : inputs;
    if (!Array.isArray(texts) || texts.length === 0) throw new ValidationError('inputs must be a string or a non-empty list of strings');
    let chars = 0;
    for (const t of texts) {
      if (typeof t !== 'string') throw new ValidationError('every input must be a string');
      if (t.length === 0) throw new ValidationError('inputs must not be empty strings');
      chars += t.length;
    }
    const opts = { maxLength: model.plan.maxLength, truncate };
    if (texts.length === 1 && chars <= this.inlineTokenizeChars) return [model.tokenizer.encode(texts[0]!, opts)];
    if (this.batchTokenizer && chars > this.inlineTokenizeChars) return this.batchTokenizer(model, texts, opts);
    return model.tokenizer.encodeBatch(texts, opts);
  }

  /** Checks pre-tokenized inputs (ids with the special tokens) against the model's limits. */
  checkTokens(model: ClientModel, encodings: Pick<Encoding, 'ids'>[]): void {
    if (encodings.length === 0) throw new ValidationError('inputs must not be empty');
    for (const e of encodings) {
      if (e.ids.length === 0) throw new ValidationError('a token sequence must not be empty');
      if (e.ids.length > model.plan.maxLength) {
        throw new ValidationError(`input of ${e.ids.length} tokens exceeds the model's ${model.plan.maxLength}`);
      }
    }
  }

  /**
   * Submits one slot per input. If any input cannot be queued (overload) or
   * fails, the others are cancelled at once: a request is answered whole or
   * not at all, and never leaves work behind.
   */
  async run(model: ClientModel, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: CallOptions = {}): Promise<{ rows: SlotResult[]; timing: Timing }> {
    const deadline = nowMs() + (opts.timeoutMs ?? this.requestTimeoutMs);
    const group = new AbortController();
    const onAbort = () => group.abort();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    if (opts.signal?.aborted) group.abort();
    try {
      const rows = await Promise.all(
        encodings.map((e) => this.submitter.submit(model.plan.index, e.ids, e.typeIds, { deadline, signal: group.signal })),
      );
      let queueMs = 0;
      let inferenceMs = 0;
      for (const r of rows) {
        queueMs = Math.max(queueMs, r.queueMs);
        inferenceMs = Math.max(inferenceMs, r.inferenceMs);
      }
      return { rows, timing: { queueMs, inferenceMs } };
    } catch (err) {
      group.abort(); // cancel whatever of this request is still queued or running
      throw err;
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
    }
  }

  async embed(model: ClientModel, encodings: Encoding[], opts: CallOptions & { normalize?: boolean }): Promise<{ vectors: Float32Array[]; timing: Timing }> {
    const { rows, timing } = await this.run(model, encodings, opts);
    const dim = model.plan.spec.hiddenSize;
    const normalize = opts.normalize ?? model.plan.spec.normalize;
    const vectors = rows.map((r) => {
      const v = r.output.subarray(0, dim);
      if (!normalize) {
        const norm = r.output[dim]!; // the graph's second output: undo the normalisation
        for (let i = 0; i < dim; i++) v[i]! *= norm;
      }
      return v;
    });
    return { vectors, timing };
  }

  async classify(model: ClientModel, encodings: Encoding[], opts: CallOptions = {}): Promise<{ classes: Classification[]; timing: Timing }> {
    const { rows, timing } = await this.run(model, encodings, opts);
    const labels = model.plan.spec.labels;
    const n = labels.length;
    const classes = rows.map((r) => {
      const probabilities = r.output.subarray(0, n);
      let best = 0;
      for (let i = 1; i < n; i++) if (probabilities[i]! > probabilities[best]!) best = i;
      return { label: labels[best]!, score: probabilities[best]!, probabilities, logits: r.output.subarray(n, 2 * n) };
    });
    return { classes, timing };
  }
}
