/**
 * The request side of inference, shared by every owner thread (each gateway
 * thread, and the in-process engine): validate inputs, tokenize, submit one
 * slot per input through the slabs, and turn result rows into embeddings or
 * class scores. Transport-free: the HTTP layer and the engine both call it.
 */
import { setMaxListeners } from 'node:events';
import type { ModelPlan } from '../inference-host.js';
import { nowMs } from '../shared/clock.js';
import { admission } from '../shared/admission.js';
import { DeadlineExceededError, InputTooLongError, ModelNotFoundError, OverloadedError, ValidationError } from '../shared/errors.js';
import type { Task } from '../shared/model-config.js';
import { INTERLEAVE_CHUNK } from '../shared/slab.js';
import type { SlabSubmitter, SlotReservation, SlotResult } from '../shared/submitter.js';
import type { EncodeOptions, Encoding, TextTokenizer } from './tokenizer.js';
import { checkModelName } from './security.js';

/** Priority classes when none are configured: index 0 is the default. */
export const DEFAULT_PRIORITY_NAMES: readonly string[] = ['interactive', 'bulk'];

export interface ClientModel {
  plan: ModelPlan;
  tokenizer: TextTokenizer;
}

/**
 * Tokenizes a list of texts off the event loop (a piscina pool); absent, batches are tokenized inline.
 * Rejects with OverloadedError when its queue is full, CancelledError when `signal` aborts while the
 * texts still wait their turn.
 */
export type BatchTokenizer = (model: ClientModel, texts: string[], opts: EncodeOptions, signal?: AbortSignal) => Promise<Encoding[]>;

export interface CallOptions {
  signal?: AbortSignal;
  /** Ms from now after which a request still queued fails instead of running. */
  timeoutMs?: number;
  /** Priority class index (0 = interactive, the default). */
  priority?: number;
  /** Slots taken for this request beforehand ({@link InferenceClient.hold}); run() fills them and gives back any left over. */
  slots?: SlotReservation;
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

/** One input: a text, or token ids with the special tokens included (TEI's and OpenAI's pre-tokenized form). */
export type Input = string | number[];
/** One input, or a list of them. A flat list of numbers is ONE pre-tokenized input; a list of lists, several. */
export type Inputs = string | number[] | Input[];

/** Whether `inputs` is one input (a text or one list of token ids) rather than a list of inputs. */
export function isSingleInput(inputs: Inputs): inputs is string | number[] {
  return typeof inputs === 'string' || (Array.isArray(inputs) && inputs.length > 0 && typeof inputs[0] === 'number');
}

/** `inputs` as a list of inputs. */
export function inputList(inputs: Inputs): Input[] {
  return isSingleInput(inputs) ? [inputs] : (inputs as Input[]);
}

/** How many inputs (slots) a request holds. */
export function inputCount(inputs: Inputs): number {
  return isSingleInput(inputs) ? 1 : Array.isArray(inputs) ? inputs.length : 0;
}

export interface RerankOptions extends CallOptions {
  /** Cut pairs longer than the model's max length (longest_first) instead of refusing them. */
  truncate?: boolean;
  /** Scores are the raw logits instead of their sigmoid. */
  rawScores?: boolean;
}

export interface RerankScore {
  /** Position of the text in the request. */
  index: number;
  score: number;
}

/** Pairs tokenized inline yield the event loop after this many ms of work. */
const YIELD_EVERY_MS = 4;

/** No inputs of its own: the predicted wait of the work already queued (a lower bound on any request's). */
const NO_LENGTHS: readonly number[] = [];

export class InferenceClient {
  private readonly models: ClientModel[];
  private readonly submitter: SlabSubmitter;
  private readonly requestTimeoutMs: number;
  /** Latency target (--slo-p99-ms): admission refuses work that cannot meet it. */
  private readonly sloP99Ms: number | undefined;
  /** Priority class names, by index (default interactive, bulk). */
  private readonly priorityNames: readonly string[];
  /** Told of every request that ran but finished past its deadline (work wasted). */
  private readonly onLate: ((model: number, tokens: number) => void) | undefined;
  private readonly batchTokenizer: BatchTokenizer | undefined;
  /** Client batches at most this long (or this many characters) are tokenized inline. */
  private readonly inlineTokenizeChars: number;

  constructor(
    models: ClientModel[],
    submitter: SlabSubmitter,
    opts: {
      requestTimeoutMs: number;
      sloP99Ms?: number;
      priorityNames?: readonly string[];
      onLate?: (model: number, tokens: number) => void;
      batchTokenizer?: BatchTokenizer;
      inlineTokenizeChars?: number;
    },
  ) {
    this.models = models;
    this.submitter = submitter;
    this.requestTimeoutMs = opts.requestTimeoutMs;
    this.sloP99Ms = opts.sloP99Ms;
    this.priorityNames = opts.priorityNames ?? DEFAULT_PRIORITY_NAMES;
    this.onLate = opts.onLate;
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

  /** The named model, or the first loaded one (any task): for routes that only tokenize. */
  anyModel(name?: string): ClientModel {
    if (name !== undefined) return this.byName(name);
    const m = this.models[0];
    if (!m) throw new ModelNotFoundError('(any model)', []);
    return m;
  }

  /**
   * The loaded model named `name`. A name no model can have (see
   * security.ts: `..`, slashes, percent signs, over 128 characters) is refused
   * first, so a name from a URL or a body never reaches more than this list.
   */
  byName(name: string): ClientModel {
    checkModelName(name);
    const m = this.models.find((x) => x.plan.spec.name === name);
    if (!m) throw new ModelNotFoundError(name, this.names());
    return m;
  }

  names(): string[] {
    return this.models.map((m) => m.plan.spec.name);
  }

  /**
   * Validates and tokenizes texts: inline when small, on the batch tokenizer (if any) when large.
   * `signal` drops texts still waiting for the batch tokenizer (the client went away).
   */
  async encode(model: ClientModel, inputs: string | string[], truncate: boolean, signal?: AbortSignal): Promise<Encoding[]> {
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
    if (this.batchTokenizer && chars > this.inlineTokenizeChars) return this.batchTokenizer(model, texts, opts, signal);
    return model.tokenizer.encodeBatch(texts, opts);
  }

  /**
   * {@link encode}, also taking pre-tokenized inputs (token ids with the
   * special tokens, checked by {@link encodeIds}, not tokenized): what the
   * HTTP APIs accept as `inputs` / `input`.
   */
  async encodeInputs(model: ClientModel, inputs: Inputs, truncate: boolean, signal?: AbortSignal): Promise<Encoding[]> {
    const list = inputList(inputs);
    if (!Array.isArray(list) || list.length === 0) throw new ValidationError('inputs must be a string, a list of token ids, or a non-empty list of those');
    if (list.every((x) => typeof x === 'string')) return this.encode(model, list as string[], truncate, signal);
    const out: Encoding[] = new Array(list.length);
    const texts: string[] = [];
    const at: number[] = [];
    list.forEach((x, i) => {
      if (typeof x === 'string') {
        texts.push(x);
        at.push(i);
      } else if (Array.isArray(x)) {
        out[i] = this.encodeIds(model, x, truncate);
      } else {
        throw new ValidationError('every input must be a string or a list of token ids');
      }
    });
    if (texts.length > 0) (await this.encode(model, texts, truncate, signal)).forEach((e, k) => (out[at[k]!] = e));
    return out;
  }

  /**
   * One pre-tokenized input: token ids as the model takes them, special tokens
   * ([CLS] ... [SEP]) included, as TEI takes them. Every id must be an integer
   * in [0, vocabulary size). Longer than the model's max length: refused, or
   * with `truncate` cut to it (the last ids go, a final [SEP] with them).
   * Type ids are all 0.
   */
  encodeIds(model: ClientModel, ids: ArrayLike<number>, truncate: boolean): Encoding {
    if (!Array.isArray(ids) && !ArrayBuffer.isView(ids)) throw new ValidationError('token ids must be a list of integers');
    const n = ids.length;
    if (n === 0) throw new ValidationError('a token sequence must not be empty');
    const max = model.plan.maxLength;
    if (n > max && !truncate) throw new InputTooLongError(n, max);
    const keep = Math.min(n, max);
    const vocab = model.tokenizer.vocabSize;
    const out = new Int32Array(keep);
    for (let i = 0; i < keep; i++) {
      const id = ids[i];
      if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= vocab) {
        throw new ValidationError(`token id ${JSON.stringify(id)} at position ${i} is not an integer in [0, ${vocab})`);
      }
      out[i] = id;
    }
    return { ids: out, typeIds: new Int32Array(keep), truncated: keep < n };
  }

  /**
   * Checks token sequences built outside the tokenizer (pre-tokenized
   * inputs, KServe tensors) against the model's limits: length, ids within
   * the vocabulary, type ids within the model's token types. Nothing out of
   * range may reach the device: an out-of-range id would fail the whole
   * batch, other requests' inputs with it.
   */
  checkTokens(model: ClientModel, encodings: (Pick<Encoding, 'ids'> & { typeIds?: Int32Array })[]): void {
    if (encodings.length === 0) throw new ValidationError('inputs must not be empty');
    const vocab = model.tokenizer.vocabSize;
    const types = model.plan.spec.typeVocabSize ?? 2;
    for (const e of encodings) {
      if (e.ids.length === 0) throw new ValidationError('a token sequence must not be empty');
      if (e.ids.length > model.plan.maxLength) {
        throw new InputTooLongError(e.ids.length, model.plan.maxLength);
      }
      for (let i = 0; i < e.ids.length; i++) {
        const id = e.ids[i]!;
        if (id < 0 || id >= vocab) throw new ValidationError(`token id ${id} at position ${i} is not in [0, ${vocab})`);
      }
      if (e.typeIds) {
        if (e.typeIds.length !== e.ids.length) throw new ValidationError('token type ids must be as many as the token ids');
        for (let i = 0; i < e.typeIds.length; i++) {
          const t = e.typeIds[i]!;
          if (t < 0 || t >= types) throw new ValidationError(`token type id ${t} at position ${i} is not in [0, ${types})`);
        }
      }
    }
  }

  /**
   * Tokenizes (query, text) pairs for a cross-encoder: [CLS] query [SEP] text
   * [SEP], type ids 0 then 1; too long and `truncate`: longest_first.
   * Inline, yielding the event loop every few ms on long lists.
   */
  async encodePairs(model: ClientModel, query: string, texts: string[], truncate: boolean): Promise<Encoding[]> {
    if (typeof query !== 'string' || query.length === 0) throw new ValidationError('query must be a non-empty string');
    if (!Array.isArray(texts) || texts.length === 0) throw new ValidationError('texts must be a non-empty list of strings');
    for (const t of texts) {
      if (typeof t !== 'string' || t.length === 0) throw new ValidationError('every text must be a non-empty string');
    }
    const tok = model.tokenizer;
    if (!tok.encodePair) throw new ValidationError(`model "${model.plan.spec.name}"'s tokenizer cannot encode pairs`);
    const opts = { maxLength: model.plan.maxLength, truncate };
    const out: Encoding[] = new Array(texts.length);
    let slice = performance.now();
    for (let i = 0; i < texts.length; i++) {
      out[i] = tok.encodePair(query, texts[i]!, opts);
      if (performance.now() - slice > YIELD_EVERY_MS && i + 1 < texts.length) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        slice = performance.now();
      }
    }
    return out;
  }

  /**
   * Submits one slot per input: in the slots `opts.slots` holds, else in slots
   * taken now, all of them or none (429 at once). Admission (the predicted
   * wait, from the inputs' token counts) comes first. If any input fails, the
   * others are cancelled at once: a request is answered whole or not at all,
   * and never leaves work behind. Slots of `opts.slots` left unfilled are given back.
   */
  async run(model: ClientModel, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: CallOptions = {}): Promise<{ rows: SlotResult[]; timing: Timing }> {
    const timeoutMs = opts.timeoutMs ?? this.requestTimeoutMs;
    const deadline = nowMs() + timeoutMs;
    let held = opts.slots;
    try {
      if (!(timeoutMs > 0)) throw new DeadlineExceededError('the request arrived with no time left before its deadline; it was not run');
      if (held && (held.model !== model.plan.index || held.size < encodings.length)) {
        throw new Error(`the request's reserved slots (${held.size} of model ${held.model}) do not fit its ${encodings.length} inputs of model ${model.plan.index}`);
      }
      held ??= this.submitter.reserve(model.plan.index, encodings.length);
      this.admit(model, encodings, timeoutMs);
      return await this.submitAll(model, encodings, held, deadline, opts);
    } finally {
      held?.release();
    }
  }

  private async submitAll(
    model: ClientModel,
    encodings: Pick<Encoding, 'ids' | 'typeIds'>[],
    held: SlotReservation,
    deadline: number,
    opts: CallOptions,
  ): Promise<{ rows: SlotResult[]; timing: Timing }> {
    const group = new AbortController();
    setMaxListeners(encodings.length + 10, group.signal); // one listener per slot: not a leak
    const onAbort = () => group.abort(opts.signal?.reason); // keeps the reason (client gone, cancel, ...) for the metrics
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    if (opts.signal?.aborted) onAbort();
    try {
      const priority = opts.priority ?? 0;
      const rows = await Promise.all(
        encodings.map((e, i) =>
          this.submitter.submit(model.plan.index, e.ids, e.typeIds, { deadline, priority, chunk: Math.floor(i / INTERLEAVE_CHUNK), signal: group.signal, reservation: held }),
        ),
      );
      // Checked again before the answer is serialised: a late answer is a timeout, not a success.
      if (nowMs() > deadline) {
        let tokens = 0;
        for (const e of encodings) tokens += e.ids.length;
        this.onLate?.(model.plan.index, tokens);
        throw new DeadlineExceededError('the request ran but finished after its deadline');
      }
      let queueMs = 0;
      let inferenceMs = 0;
      for (const r of rows) {
        queueMs = Math.max(queueMs, r.queueMs);
        inferenceMs = Math.max(inferenceMs, r.inferenceMs);
      }
      return { rows, timing: { queueMs, inferenceMs } };
    } catch (err) {
      group.abort('request_failed'); // cancel whatever of this request is still queued or running
      throw err;
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
    }
  }

  /** The index of a priority class by name ("interactive", "bulk", ...). */
  priorityIndex(name: string): number {
    const i = this.priorityNames.indexOf(name);
    if (i < 0) throw new ValidationError(`unknown priority "${name}"; classes: ${this.priorityNames.join(', ')}`);
    return i;
  }

  /**
   * Takes `count` slots of `model` for one request before its inputs are
   * tokenized, and refuses it at once (429) when fewer are free, or when the
   * work already queued, without its own inputs (whose token counts are not
   * known yet), would make it miss its deadline or the latency target. So a
   * request that will be refused never waits for the tokenizer pool, and one
   * admitted cannot lose its slots while it is tokenized. Pass the result as
   * `slots` to run() (embed, classify, ...), and release() it in any case.
   */
  hold(model: ClientModel, count: number, opts: Pick<CallOptions, 'timeoutMs'> = {}): SlotReservation {
    const timeoutMs = opts.timeoutMs ?? this.requestTimeoutMs;
    if (!(timeoutMs > 0)) throw new DeadlineExceededError('the request arrived with no time left before its deadline; it was not run');
    const held = this.submitter.reserve(model.plan.index, count);
    try {
      this.admitWait(this.submitter.predictedWaitMs(model.plan.index, NO_LENGTHS), timeoutMs);
    } catch (err) {
      held.release();
      throw err;
    }
    return held;
  }

  /** {@link hold}, then `fn` with the slots in the call options; they are given back when it settles. */
  async withSlots<T>(model: ClientModel, count: number, opts: CallOptions, fn: (call: CallOptions) => Promise<T>): Promise<T> {
    if (!(count >= 1)) return fn(opts); // no inputs: refused by their validation, not here
    const slots = this.hold(model, count, opts);
    try {
      return await fn({ ...opts, slots });
    } finally {
      slots.release();
    }
  }

  /**
   * A refusal that needs no request body (so the body need not even be read):
   * 429 when none of the models the request may use (the one named in the
   * path, else every model of `task`: the body may name any; `task` null:
   * any task) has a free slot, or, with a latency target, when each one's
   * queued work alone would miss it. Null when the request may go on, or when
   * the path names no loaded model of `task` (the request then fails as usual,
   * for its own reason). Reads a few shared counters: no allocation unless refused.
   */
  refusalBeforeBody(task: Task | null, pathModel?: string): { error: OverloadedError; model: string | undefined } | null {
    let candidates: ClientModel[];
    if (pathModel !== undefined) {
      const m = this.models.find((x) => x.plan.spec.name === pathModel);
      if (!m || (task !== null && m.plan.spec.task !== task)) return null;
      candidates = [m];
    } else {
      candidates = task === null ? this.models : this.models.filter((x) => x.plan.spec.task === task);
      if (candidates.length === 0) return null;
    }
    const label = candidates.length === 1 ? candidates[0]!.plan.spec.name : undefined;
    if (candidates.every((m) => this.submitter.freeSlots(m.plan.index) === 0)) {
      return { error: new OverloadedError('every request slot of the model is in use; retry shortly'), model: label };
    }
    if (this.sloP99Ms === undefined) return null; // the limit is the request's deadline, which its body may set
    let refusal: OverloadedError | null = null;
    for (const m of candidates) {
      const d = admission({ predictedWaitMs: this.submitter.predictedWaitMs(m.plan.index, NO_LENGTHS), remainingMs: Infinity, targetMs: this.sloP99Ms });
      if (d.admit) return null;
      refusal ??= new OverloadedError(`predicted wait ${Math.round(d.predictedWaitMs)} ms exceeds the latency target; retry later`, d.retryAfterSeconds);
    }
    return refusal ? { error: refusal, model: label } : null;
  }

  /** Refuses at once (429) a request the queue ahead of it would make miss its deadline or the latency target. */
  private admit(model: ClientModel, encodings: Pick<Encoding, 'ids'>[], timeoutMs: number): void {
    this.admitWait(
      this.submitter.predictedWaitMs(
        model.plan.index,
        encodings.map((e) => e.ids.length),
      ),
      timeoutMs,
    );
  }

  private admitWait(predictedWaitMs: number, timeoutMs: number): void {
    const d = admission({
      predictedWaitMs,
      remainingMs: timeoutMs,
      ...(this.sloP99Ms !== undefined ? { targetMs: this.sloP99Ms } : {}),
    });
    if (!d.admit) {
      throw new OverloadedError(
        `predicted wait ${Math.round(d.predictedWaitMs)} ms exceeds the ${this.sloP99Ms !== undefined ? 'latency target' : "request's deadline"}; retry later`,
        d.retryAfterSeconds,
      );
    }
  }

  async embed(model: ClientModel, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: CallOptions & { normalize?: boolean } = {}): Promise<{ vectors: Float32Array[]; timing: Timing }> {
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

  async classify(model: ClientModel, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: CallOptions = {}): Promise<{ classes: Classification[]; timing: Timing }> {
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

  /**
   * Scores each (query, text) pair with a cross-encoder (a `rerank` model):
   * the sigmoid of its logit, or the logit with `rawScores`. Scores come in
   * input order; sorting is the caller's business.
   */
  async rerank(model: ClientModel, query: string, texts: string[], opts: RerankOptions = {}): Promise<{ scores: RerankScore[]; timing: Timing; tokens: number }> {
    if (model.plan.spec.task !== 'rerank') throw new ValidationError(`model "${model.plan.spec.name}" is a ${model.plan.spec.task} model, not rerank`);
    const encodings = await this.encodePairs(model, query, texts, opts.truncate ?? false);
    return this.rerankEncoded(model, encodings, opts);
  }

  /** {@link rerank} on pairs already tokenized (encodePairs, or token tensors). */
  async rerankEncoded(model: ClientModel, encodings: Pick<Encoding, 'ids' | 'typeIds'>[], opts: RerankOptions = {}): Promise<{ scores: RerankScore[]; timing: Timing; tokens: number }> {
    const { rows, timing } = await this.run(model, encodings, opts);
    const column = opts.rawScores ? 1 : 0; // the row is [sigmoid(logit), logit]
    let tokens = 0;
    for (const e of encodings) tokens += e.ids.length;
    return { scores: rows.map((r, index) => ({ index, score: r.output[column]! })), timing, tokens };
  }
}
