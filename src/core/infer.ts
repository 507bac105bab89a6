/**
 * The request side of inference, shared by every owner thread (each gateway
 * thread, and the in-process engine): one call per request, `infer()`, as
 * text-embeddings-inference's `Infer::embed_pooled` is one call. It takes the
 * whole request and, in order:
 *
 *   1. holds its slots (all of them or 429 at once), and refuses it (429) if
 *      the work already queued would make it miss its deadline or the target;
 *   2. tokenizes its texts (inline when small, on the pool when large) or
 *      checks its token ids;
 *   3. with the result cache on (--cache-mb, src/shared/result-cache.ts),
 *      looks up every input: all found, the request is answered here (no
 *      slot, no queue, no inference thread); otherwise only the misses go on;
 *   4. refuses it (429) if its own tokens would make it miss the deadline;
 *   5. submits every input (every miss) through the slabs and awaits all their
 *      rows (one promise; a failing input fails the request and cancels the
 *      others); each miss's row is stored in the cache as it came;
 *   6. answers rows, timing and token counts; a late answer is a 504.
 *
 * With the cache on, a request tokenized on this thread (within
 * --inline-tokenize-chars, or token ids) is tokenized and looked up before
 * step 1, which then takes slots for its misses only: a full hit never needs
 * a free slot. One bound for the tokenizer pool keeps the order above, so an
 * overloaded server still refuses it before the pool spends work on it, and
 * gives back the slots of its hits.
 *
 * What the rows mean per task (embeddings, class scores, rerank scores) is
 * read by the functions at the end of this file; answer shapes are the
 * dialects' business (routes*.ts, src/gateway/ws/api.ts, the engine). Transport-free.
 */
import type { SpanIds } from '../shared/trace-context.js';
import { colbertTextLength, markColbert, type ColbertInputType } from './colbert.js';
import type { ModelPlan } from '../shared/model-plan.js';
import { admission } from './admission.js';
import type { Cancellation } from './cancel.js';
import { nowMs } from '../shared/clock.js';
import { DeadlineExceededError, InputTooLongError, ModelNotFoundError, OutputUnavailableError, OverloadedError, ValidationError, WrongTaskError } from '../shared/errors.js';
import { checkModelName, type ModelOutput, type Task } from '../shared/model-format/model-config.js';
import { fillMissing, lookUp, type ResultCache } from '../shared/result-cache.js';
import type { RequestRows, SlabSubmitter, SlotReservation } from './submitter.js';
import { partSizeFor, submitInParts } from './client-batches.js';
import { DEFAULTS } from '../shared/options.js';
import type { EncodeOptions, Encoding, TextTokenizer, TruncationDirection } from './tokenizer/tokenizer.js';

export interface ServedModel {
  plan: ModelPlan;
  tokenizer: TextTokenizer;
}

/**
 * Tokenizes a list of texts off the event loop (a piscina pool); absent, batches are tokenized inline.
 * Rejects with OverloadedError when its queue is full, CancelledError when `cancel` fires while the
 * texts still wait their turn.
 */
export type BatchTokenizer = (model: ServedModel, texts: string[], opts: EncodeOptions, cancel?: Cancellation) => Promise<Encoding[]>;

/** Token ids (special tokens included) and their type ids: what one slot holds. */
export type Tokens = Pick<Encoding, 'ids'> & {
  typeIds: Int32Array | null;
  /** Leading tokens the pooling leaves out (a prompt's, include_prompt false); default 0. */
  poolFrom?: number;
  /** Leading tokens the attention sees, where fewer than all (ColBERT's query expansion); default all. */
  attended?: number;
};

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

export interface RerankScore {
  /** Position of the text in the request. */
  index: number;
  score: number;
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

/** Whether an input longer than the model's max length is cut (else refused, 413), and on which side. */
export interface Truncation {
  truncate: boolean;
  direction?: TruncationDirection | undefined;
  /** Tokens an input may have, where fewer than the model's max length (a ColBERT query's). */
  maxLength?: number | undefined;
}

/** What one request runs, one input per slot. */
export type CallInputs =
  /** Texts and/or pre-tokenized ids (TEI's /embed and /predict, OpenAI's input). */
  | {
      kind: 'inputs';
      inputs: readonly Input[];
      truncate: boolean;
      direction?: TruncationDirection | undefined;
      /** Leading tokens of each text input the pooling leaves out: its prompt's (prompts.ts, include_prompt false). */
      poolFrom?: number | undefined;
      /** A ColBERT model's inputs: marked, cut and expanded as PyLate does for this type (core/colbert.ts). */
      colbert?: ColbertInputType | undefined;
    }
  /** (query, text) pairs for a cross-encoder: one query for every text, or one per text. */
  | { kind: 'pairs'; queries: readonly string[]; texts: readonly string[]; truncate: boolean }
  /** Tokens built outside the tokenizer (KServe tensors), checked against the model's limits here. */
  | { kind: 'tokens'; tokens: readonly Tokens[] };

export interface InferCall {
  model: ServedModel;
  inputs: CallInputs;
  /** Ms from now after which a request still queued fails instead of running (default: requestTimeoutMs). */
  timeoutMs?: number | undefined;
  /** Priority class index (0 = interactive, the default). */
  priority?: number | undefined;
  /** Cancels the request wherever it is (waiting for the tokenizer pool, queued, running). */
  cancel?: Cancellation | undefined;
  /**
   * Each input's token vectors too (InferResult.rows.tokens: /embed_all): its
   * slots take pages of the model's token area, the result cache is passed by,
   * and the request runs whole (at most one part's inputs).
   */
  tokenRows?: boolean | undefined;
  /** The request's sampled span (tracing on): its slots carry it, for their batches' spans to link to. */
  trace?: SpanIds | undefined;
}

export interface InferResult {
  /** One row per input, in order: `rows.rows.subarray(i * rows.width, ...)`. */
  rows: RequestRows;
  /** Real tokens of every input (special tokens included): usage. */
  tokens: number;
  tokenizeMs: number;
  timing: Timing;
  /** With the result cache on: 'hit' when every input was answered from it (no slot, no run; timing 0), else 'miss'. Absent: off. */
  cache?: 'hit' | 'miss';
  /** A call with tokenRows: each input's token ids as they ran (rows.tokens[i] has a vector for each). */
  inputIds?: Int32Array[];
}

/** Pairs tokenized inline yield the event loop after this many ms of work. */
const YIELD_EVERY_MS = 4;

export class Infer {
  private readonly models: ServedModel[];
  private readonly byTask = new Map<Task, readonly ServedModel[]>();
  private readonly submitter: SlabSubmitter;
  /** A request's deadline when it names none (--request-timeout-ms). */
  readonly requestTimeoutMs: number;
  /** Latency target (--slo-p99-ms): admission refuses work that cannot meet it. */
  private readonly sloP99Ms: number | undefined;
  /** Priority class names, by index (default interactive, bulk). */
  private readonly priorityNames: readonly string[];
  /** Told of every request that ran but finished past its deadline (work wasted). */
  private readonly onLate: ((model: number, tokens: number) => void) | undefined;
  private readonly batchTokenizer: BatchTokenizer | undefined;
  /** Client batches at most this long (or this many characters) are tokenized inline. */
  private readonly inlineTokenizeChars: number;
  /** The result cache (--cache-mb), or null: off. */
  private readonly cache: ResultCache | null;

  constructor(
    models: ServedModel[],
    submitter: SlabSubmitter,
    opts: {
      requestTimeoutMs: number;
      sloP99Ms?: number;
      priorityNames?: readonly string[];
      onLate?: (model: number, tokens: number) => void;
      batchTokenizer?: BatchTokenizer;
      inlineTokenizeChars?: number;
      /** Rows of inputs seen before (src/shared/result-cache.ts); absent: every input runs. */
      cache?: ResultCache | null;
    },
  ) {
    this.models = models;
    this.submitter = submitter;
    this.requestTimeoutMs = opts.requestTimeoutMs;
    this.sloP99Ms = opts.sloP99Ms;
    this.priorityNames = opts.priorityNames ?? DEFAULTS.priorities.map((p) => p.name);
    this.onLate = opts.onLate;
    this.batchTokenizer = opts.batchTokenizer;
    this.inlineTokenizeChars = opts.inlineTokenizeChars ?? DEFAULTS.inlineTokenizeChars;
    this.cache = opts.cache ?? null;
  }

  list(): ServedModel[] {
    return this.models;
  }

  /** How a model not loaded can be, said in its 404 (the gateway knows the repository's folders). */
  missingHint: ((name: string) => string) | undefined;

  /** Serves `model` from now on, in place of the version of it served so far (a reload), else after the others. */
  addModel(model: ServedModel): void {
    const at = this.models.findIndex((x) => x.plan.spec.name === model.plan.spec.name);
    if (at >= 0) this.models[at] = model;
    else this.models.push(model);
    this.byTask.clear();
  }

  /** New requests no longer find the model of id `id` (requests that already did finish on it). False if it was not served. */
  removeModel(id: number): boolean {
    const at = this.models.findIndex((x) => x.plan.index === id);
    if (at < 0) return false;
    this.models.splice(at, 1);
    this.byTask.clear();
    return true;
  }

  /** The models of `task`, in order (made once per task: asked on every request). */
  private modelsOf(task: Task): readonly ServedModel[] {
    let list = this.byTask.get(task);
    if (!list) this.byTask.set(task, (list = this.models.filter((x) => x.plan.spec.task === task)));
    return list;
  }

  /**
   * The named model, or the first of the right task; checks the task matches.
   * Every route of the embed task but /embed_sparse and /embed_all reads
   * pooled rows, so for 'embed' this is resolveOutput('dense'): a ColBERT
   * model (token vectors only) is 424 there.
   */
  resolve(task: Task, name?: string): ServedModel {
    return task === 'embed' ? this.resolveOutput('dense', 'this route', name) : this.ofTask(task, name);
  }

  private ofTask(task: Task, name?: string): ServedModel {
    if (name !== undefined) {
      const m = this.byName(name);
      if (m.plan.spec.task !== task) throw new WrongTaskError(`model "${name}" is a ${m.plan.spec.task} model, not ${task}`);
      return m;
    }
    const m = this.modelsOf(task)[0];
    if (!m) throw new ModelNotFoundError(`(any ${task} model)`, this.names());
    return m;
  }

  /**
   * The named embedding model, which must give `output`, or the first that
   * does: a model without it is refused 424 naming what it gives (TEI's answer
   * to /embed_sparse on a dense model).
   */
  resolveOutput(output: ModelOutput, route: string, name?: string): ServedModel {
    if (name !== undefined) {
      const m = this.ofTask('embed', name);
      if (!m.plan.spec.outputs.includes(output)) {
        throw new OutputUnavailableError(`model "${name}" has no ${output} output for ${route}: it gives ${m.plan.spec.outputs.join(' and ')}`);
      }
      return m;
    }
    const embedders = this.modelsOf('embed');
    if (embedders.length === 0) throw new ModelNotFoundError('(any embed model)', this.names());
    const m = embedders.find((x) => x.plan.spec.outputs.includes(output));
    if (!m) throw new OutputUnavailableError(`no model served gives a ${output} output for ${route} (served: ${this.names().join(', ') || 'none'})`);
    return m;
  }

  /** The named model, or the first loaded one (any task): for routes that only tokenize. */
  anyModel(name?: string): ServedModel {
    if (name !== undefined) return this.byName(name);
    const m = this.models[0];
    if (!m) throw new ModelNotFoundError('(any model)', []);
    return m;
  }

  /**
   * The loaded model named `name`. A name no model can have (checkModelName,
   * shared/model-format/model-config.ts: `..`, slashes, percent signs, over 128 characters) is refused
   * first, so a name from a URL or a body never reaches more than this list.
   */
  byName(name: string): ServedModel {
    checkModelName(name);
    const m = this.models.find((x) => x.plan.spec.name === name);
    if (!m) throw new ModelNotFoundError(name, this.names(), this.missingHint?.(name));
    return m;
  }

  names(): string[] {
    return this.models.map((m) => m.plan.spec.name);
  }

  /** The index of a priority class by name ("interactive", "bulk", ...). */
  priorityIndex(name: string): number {
    const i = this.priorityNames.indexOf(name);
    if (i < 0) throw new ValidationError(`unknown priority "${name}"; classes: ${this.priorityNames.join(', ')}`);
    return i;
  }

  /** The result cache for `model`'s rows: null when off, or for a model loaded after start (it has no region). */
  private cacheOf(model: ServedModel): ResultCache | null {
    return this.cache?.covers(model.plan.index) ? this.cache : null;
  }

  /** Runs one request (see the header): its rows, tokens and timing. */
  async infer(call: InferCall): Promise<InferResult> {
    const model = call.model;
    const timeoutMs = call.timeoutMs ?? this.requestTimeoutMs;
    if (!(timeoutMs > 0)) throw new DeadlineExceededError('the request arrived with no time left before its deadline; it was not run');
    const deadline = nowMs() + timeoutMs;
    const count = callCount(call.inputs);
    const partSize = this.partSize(model);
    const tokenRows = call.tokenRows === true;
    const spec = model.plan.spec;
    // Routes that name a model of any task (OpenAI's, KServe's) reach here too: pooled rows need a dense output.
    if (spec.task === 'embed' && !tokenRows && !spec.outputs.includes('dense')) {
      throw new OutputUnavailableError(`model "${spec.name}" has no dense output: it gives ${spec.outputs.join(' and ')} (/embed_all)`);
    }
    if (count > partSize) {
      if (tokenRows) throw new ValidationError(`${count} inputs of token vectors in one request; at most ${partSize} for model "${model.plan.spec.name}" (--max-batch-size, at least 32, at most a quarter of --slots-per-model)`);
      return this.inferInParts(call, count, deadline, timeoutMs, partSize);
    }
    // With the cache, a request tokenized here is looked up before it takes a slot (a full hit needs
    // none); one bound for the tokenizer pool takes its slots first, so overload is refused before the pool works.
    // The cache keeps pooled rows only: a request for token vectors runs.
    const cache = tokenRows ? null : this.cacheOf(model);
    let held = cache && this.tokenizedInline(model, call.inputs) ? null : this.hold(model, count, timeoutMs, tokenRows);
    try {
      const t0 = nowMs();
      const pending = this.tokenize(model, call.inputs, call.cancel);
      const tokens = pending instanceof Promise ? await pending : pending; // no extra turn when inline
      const tokenizeMs = nowMs() - t0;
      const index = model.plan.index;
      const width = model.plan.layout.outputWidth;
      const look = cache ? lookUp(cache, index, tokens, width) : null;
      let rows: RequestRows;
      if (look && look.missing.length === 0) {
        rows = { rows: look.rows, width, queueMs: 0, inferenceMs: 0 }; // answered here: no slot, no queue, no run
      } else {
        const run = look ? look.missing.map((i) => tokens[i]!) : tokens;
        held ??= this.hold(model, run.length, timeoutMs, tokenRows);
        this.admitWait(this.submitter.predictedWaitMs(index, run), timeoutMs);
        rows = await this.submitter.submitRequest(index, run, { deadline, priority: call.priority, cancel: call.cancel, reservation: held, trace: call.trace });
        if (look) rows = { ...rows, rows: fillMissing(cache!, index, tokens, look, rows.rows, width) };
      }
      let tokenCount = 0;
      for (const t of tokens) tokenCount += t.ids.length;
      return this.answered(model, deadline, {
        rows,
        tokens: tokenCount,
        tokenizeMs,
        timing: timingOf(rows),
        ...(look ? { cache: look.missing.length === 0 ? 'hit' : 'miss' } : {}),
        ...(tokenRows ? { inputIds: tokens.map((t) => t.ids) } : {}),
      });
    } finally {
      held?.release();
    }
  }

  /**
   * A client batch larger than one part (client-batches.ts): its first part's slots taken now
   * (refused at once, as any request's), then each part tokenized, looked up in the cache and
   * run in turn, the next one prepared while this one runs. Admission judges the queue ahead and
   * the first part: a large batch's own later parts wait behind other requests, not the reverse.
   */
  private async inferInParts(call: InferCall, count: number, deadline: number, timeoutMs: number, partSize: number): Promise<InferResult> {
    const model = call.model;
    const index = model.plan.index;
    const width = model.plan.layout.outputWidth;
    // With the cache, the first part takes its slots after its lookup (a part it answers needs none).
    const cache = this.cacheOf(model);
    const first = cache ? undefined : this.hold(model, partSize, timeoutMs);
    const spent = { tokenizeMs: 0, tokens: 0 };
    try {
      // Texts and ids are tokenized part by part; pairs and KServe tensors at once (then sliced).
      const inputs = call.inputs;
      const texts = inputs.kind === 'inputs' ? inputs : null;
      const whole = texts ? null : await this.tokenize(model, inputs, call.cancel);
      const prepare = async (from: number, to: number, cancel: Cancellation): Promise<Tokens[]> => {
        const t0 = nowMs();
        const tokens = texts ? await this.tokenize(model, { ...texts, inputs: texts.inputs.slice(from, to) }, cancel) : whole!.slice(from, to);
        spent.tokenizeMs += nowMs() - t0;
        for (const t of tokens) spent.tokens += t.ids.length;
        return tokens;
      };
      const rows = await submitInParts({
        submitter: this.submitter,
        model: index,
        count,
        width,
        prepare,
        admit: (xs) => this.admitWait(this.submitter.predictedWaitMs(index, xs), timeoutMs),
        cache: cache ? { lookUp: (xs) => lookUp(cache, index, xs, width), fill: (xs, look, ran) => fillMissing(cache, index, xs, look, ran, width) } : undefined,
        first,
        takeFirst: (n) => this.hold(model, n, timeoutMs),
        partSize,
        deadline,
        priority: call.priority,
        cancel: call.cancel,
        trace: call.trace,
      });
      return this.answered(model, deadline, { rows, tokens: spent.tokens, tokenizeMs: spent.tokenizeMs, timing: timingOf(rows), ...(cache ? { cache: rows.allCached ? 'hit' : 'miss' } : {}) });
    } finally {
      first?.release();
    }
  }

  /** The result, unless it came past its deadline: a late answer is a timeout, not a success (checked before it is serialised). */
  private answered(model: ServedModel, deadline: number, r: InferResult): InferResult {
    if (nowMs() > deadline) {
      this.onLate?.(model.plan.index, r.tokens);
      throw new DeadlineExceededError('the request ran but finished after its deadline');
    }
    return r;
  }

  /** The most slots one request holds at once: a larger client batch runs part by part. */
  private partSize(model: ServedModel): number {
    return partSizeFor(model.plan.layout.slotCount, model.plan.batching.maxBatchSize);
  }

  /**
   * Whether a request's inputs are tokenized on this thread (or are tokens
   * already) rather than on the tokenizer pool: the rule of encodeTexts (the
   * pool takes what does not fit inline, fitsInline), and pairs that fit.
   */
  private tokenizedInline(model: ServedModel, inputs: CallInputs): boolean {
    switch (inputs.kind) {
      case 'tokens':
        return true;
      case 'inputs':
        return !this.batchTokenizer || this.fitsInline(model, inputs.inputs);
      case 'pairs':
        return this.fitsInline(model, [...inputs.queries, ...inputs.texts]);
    }
  }

  /**
   * The inline rule: the texts' characters at the library's pace (TextTokenizer.paceChars: an
   * eighth for ASCII the fast path takes) are at most --inline-tokenize-chars. Counted plainly
   * first: a request within the bound by its length needs no closer look.
   */
  private fitsInline(model: ServedModel, list: readonly unknown[]): boolean {
    let chars = 0;
    for (const x of list) if (typeof x === 'string') chars += x.length;
    if (chars <= this.inlineTokenizeChars) return true;
    chars = 0;
    for (const x of list) if (typeof x === 'string') chars += model.tokenizer.paceChars(x);
    return chars <= this.inlineTokenizeChars;
  }

  /** Whether the cache may answer a request of `m` without a slot (it holds some of its rows). */
  private mayHit(m: ServedModel): boolean {
    return this.cacheOf(m)?.holds(m.plan.index) ?? false;
  }

  /**
   * A refusal that needs no request body (so the body need not even be read):
   * 429 when none of the models the request may use (the one named in the
   * path, else every model of `task`: the body may name any; `task` null:
   * any task) has a free slot, or, with a latency target, when each one's
   * queued work alone would miss it. Null when the request may go on, or when
   * the path names no loaded model of `task` (the request then fails as usual,
   * for its own reason). A model whose rows the result cache holds is never
   * refused here: the request may be a full hit, which needs neither a slot
   * nor the queue (a miss is refused after its lookup instead). Reads a few
   * shared counters: no allocation unless refused.
   */
  refusalBeforeBody(task: Task | null, pathModel?: string): { error: OverloadedError; model: string | undefined } | null {
    let candidates: readonly ServedModel[];
    if (pathModel !== undefined) {
      const m = this.models.find((x) => x.plan.spec.name === pathModel);
      if (!m || (task !== null && m.plan.spec.task !== task)) return null;
      candidates = [m];
    } else {
      candidates = task === null ? this.models : this.modelsOf(task);
      if (candidates.length === 0) return null;
    }
    const label = candidates.length === 1 ? candidates[0]!.plan.spec.name : undefined;
    // A model whose rows the cache holds may answer without a slot or the queue: refused after its lookup, if at all.
    if (candidates.every((m) => this.submitter.freeSlots(m.plan.index) === 0 && !this.mayHit(m))) {
      return { error: new OverloadedError('every request slot of the model is in use; retry shortly'), model: label };
    }
    if (this.sloP99Ms === undefined) return null; // the limit is the request's deadline, which its body may set
    let refusal: OverloadedError | null = null;
    for (const m of candidates) {
      const d = admission({ predictedWaitMs: this.submitter.predictedWaitMs(m.plan.index), remainingMs: Infinity, targetMs: this.sloP99Ms });
      if (d.admit || this.mayHit(m)) return null;
      refusal ??= new OverloadedError(`predicted wait ${Math.round(d.predictedWaitMs)} ms exceeds the latency target; retry later`, d.retryAfterSeconds);
    }
    return refusal ? { error: refusal, model: label } : null;
  }

  /**
   * Takes `count` slots of `model` for one request before its inputs are
   * tokenized, and refuses it at once (429) when fewer are free, or when the
   * work already queued, without its own inputs (whose token counts are not
   * known yet), would make it miss its deadline or the latency target. So a
   * request that will be refused never waits for the tokenizer pool, and one
   * admitted cannot lose its slots while it is tokenized.
   */
  private hold(model: ServedModel, count: number, timeoutMs: number, tokenRows = false): SlotReservation {
    if (!(count >= 1)) throw new ValidationError('inputs must not be empty');
    const held = this.submitter.reserve(model.plan.index, count, tokenRows);
    try {
      this.admitWait(this.submitter.predictedWaitMs(model.plan.index), timeoutMs);
    } catch (err) {
      held.release();
      throw err;
    }
    return held;
  }

  /** Refuses at once (429) a request the queue ahead of it would make miss its deadline or the latency target. */
  private admitWait(predictedWaitMs: number, timeoutMs: number): void {
    const d = admission({ predictedWaitMs, remainingMs: timeoutMs, ...(this.sloP99Ms !== undefined ? { targetMs: this.sloP99Ms } : {}) });
    if (!d.admit) {
      throw new OverloadedError(
        `predicted wait ${Math.round(d.predictedWaitMs)} ms exceeds the ${this.sloP99Ms !== undefined ? 'latency target' : "request's deadline"}; retry later`,
        d.retryAfterSeconds,
      );
    }
  }

  /** The tokens of a request's inputs: synchronous when they are tokenized inline or already tokens. */
  private tokenize(model: ServedModel, inputs: CallInputs, cancel: Cancellation | undefined): Tokens[] | Promise<Tokens[]> {
    switch (inputs.kind) {
      case 'inputs': {
        if (inputs.colbert) return this.colbertTokens(model, inputs.inputs, inputs.colbert, inputs.direction, cancel);
        const encoded = this.encodeInputs(model, inputs.inputs, inputs, cancel);
        if (!inputs.poolFrom) return encoded;
        const mark = (e: Encoding[]) => poolingFrom(inputs.inputs, e, inputs.poolFrom!, inputs.direction);
        return encoded instanceof Promise ? encoded.then(mark) : mark(encoded);
      }
      case 'pairs':
        return this.encodePairs(model, inputs.queries, inputs.texts, inputs.truncate);
      case 'tokens':
        this.checkTokens(model, inputs.tokens);
        return inputs.tokens as Tokens[];
    }
  }

  /** A ColBERT model's texts, cut to their type's length (always, as PyLate does), marked and a query expanded. */
  private colbertTokens(model: ServedModel, inputs: readonly Input[], kind: ColbertInputType, direction: TruncationDirection | undefined, cancel: Cancellation | undefined): Tokens[] | Promise<Tokens[]> {
    if (inputs.some((x) => typeof x !== 'string')) throw new ValidationError('a ColBERT model takes texts, not token ids: the server puts in its query and document markers');
    const c = model.plan.spec.colbert!;
    const maxLength = colbertTextLength(c, kind, model.plan.maxLength);
    const encoded = this.encodeTexts(model, inputs as string[], { truncate: true, direction, maxLength }, cancel);
    const mark = (list: Encoding[]) => list.map((e) => markColbert(e, c, kind, model.plan.maxLength));
    return encoded instanceof Promise ? encoded.then(mark) : mark(encoded);
  }

  /**
   * Validates and tokenizes texts: inline when small, on the batch tokenizer (if any) when large.
   * `cancel` drops texts still waiting for the batch tokenizer (the client went away).
   */
  encodeTexts(model: ServedModel, texts: readonly string[], cut: Truncation, cancel?: Cancellation): Encoding[] | Promise<Encoding[]> {
    if (texts.length === 0) throw new ValidationError('inputs must be a string or a non-empty list of strings');
    for (const t of texts) {
      if (typeof t !== 'string') throw new ValidationError('every input must be a string');
      if (t.length === 0) throw new ValidationError('inputs must not be empty strings');
    }
    const opts = { maxLength: cut.maxLength ?? model.plan.maxLength, truncate: cut.truncate, direction: cut.direction };
    const inline = this.fitsInline(model, texts);
    if (texts.length === 1 && inline) return [model.tokenizer.encode(texts[0]!, opts)];
    if (this.batchTokenizer && !inline) return this.batchTokenizer(model, texts as string[], opts, cancel);
    return model.tokenizer.encodeBatch(texts as string[], opts);
  }

  /**
   * {@link encodeTexts}, also taking pre-tokenized inputs (token ids with the
   * special tokens, checked by {@link encodeIds}, not tokenized): what the
   * HTTP APIs accept as `inputs` / `input`.
   */
  encodeInputs(model: ServedModel, list: readonly Input[], cut: Truncation, cancel?: Cancellation): Encoding[] | Promise<Encoding[]> {
    if (list.length === 0) throw new ValidationError('inputs must be a string, a list of token ids, or a non-empty list of those');
    let texts = 0;
    for (const x of list) if (typeof x === 'string') texts++;
    if (texts === list.length) return this.encodeTexts(model, list as string[], cut, cancel);
    const out: Encoding[] = new Array(list.length);
    const textList: string[] = [];
    const at: number[] = [];
    list.forEach((x, i) => {
      if (typeof x === 'string') {
        textList.push(x);
        at.push(i);
      } else if (Array.isArray(x)) {
        out[i] = this.encodeIds(model, x, cut);
      } else {
        throw new ValidationError('every input must be a string or a list of token ids');
      }
    });
    if (textList.length === 0) return out;
    const fill = (encoded: Encoding[]) => {
      encoded.forEach((e, k) => (out[at[k]!] = e));
      return out;
    };
    const encoded = this.encodeTexts(model, textList, cut, cancel);
    return encoded instanceof Promise ? encoded.then(fill) : fill(encoded);
  }

  /**
   * One pre-tokenized input: token ids as the model takes them, special tokens
   * ([CLS] ... [SEP]) included, as TEI takes them. Every id must be an integer
   * in [0, vocabulary size). Longer than the model's max length: refused, or
   * with `truncate` cut to it: the last ids go, a final [SEP] with them (or,
   * with direction left, the first ids, a [CLS] with them: the ids are taken
   * as sent). Type ids are all 0.
   */
  encodeIds(model: ServedModel, ids: ArrayLike<number>, cut: Truncation): Encoding {
    if (!Array.isArray(ids) && !ArrayBuffer.isView(ids)) throw new ValidationError('token ids must be a list of integers');
    const n = ids.length;
    if (n === 0) throw new ValidationError('a token sequence must not be empty');
    const max = model.plan.maxLength;
    if (n > max && !cut.truncate) throw new InputTooLongError(n, max);
    const keep = Math.min(n, max);
    const from = cut.direction === 'left' ? n - keep : 0;
    const vocab = model.tokenizer.vocabSize;
    const out = new Int32Array(keep);
    for (let i = 0; i < keep; i++) {
      const id = ids[from + i];
      if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= vocab) {
        throw new ValidationError(`token id ${JSON.stringify(id)} at position ${from + i} is not an integer in [0, ${vocab})`);
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
  checkTokens(model: ServedModel, encodings: readonly (Pick<Encoding, 'ids'> & { typeIds?: Int32Array | null })[]): void {
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
   * [SEP], type ids 0 then 1; too long and `truncate`: longest_first. One
   * query for every text, or one per text. Inline, yielding the event loop
   * every few ms on long lists.
   */
  async encodePairs(model: ServedModel, queries: readonly string[], texts: readonly string[], truncate: boolean): Promise<Encoding[]> {
    if (queries.length !== 1 && queries.length !== texts.length) throw new ValidationError(`${queries.length} queries for ${texts.length} texts: give one, or one per text`);
    for (const q of queries) if (typeof q !== 'string' || q.length === 0) throw new ValidationError('query must be a non-empty string');
    if (texts.length === 0) throw new ValidationError('texts must be a non-empty list of strings');
    for (const t of texts) {
      if (typeof t !== 'string' || t.length === 0) throw new ValidationError('every text must be a non-empty string');
    }
    const tok = model.tokenizer;
    if (!tok.encodePair) throw new ValidationError(`model "${model.plan.spec.name}"'s tokenizer cannot encode pairs`);
    const opts = { maxLength: model.plan.maxLength, truncate };
    const out: Encoding[] = new Array(texts.length);
    let slice = performance.now();
    for (let i = 0; i < texts.length; i++) {
      out[i] = tok.encodePair(queries.length === 1 ? queries[0]! : queries[i]!, texts[i]!, opts);
      if (performance.now() - slice > YIELD_EVERY_MS && i + 1 < texts.length) {
        await new Promise<void>((resolve) => setImmediate(resolve));
        slice = performance.now();
      }
    }
    return out;
  }
}

/**
 * The encodings with the first `poolFrom` tokens of each text input left out
 * of the pooling (token-id inputs are taken as sent: pooled whole). A text cut
 * on the left has lost the start of its prompt, and what is left of it is not
 * known here: refused.
 */
function poolingFrom(inputs: readonly Input[], encoded: Encoding[], poolFrom: number, direction: TruncationDirection | undefined): Tokens[] {
  return encoded.map((e, i) => {
    if (typeof inputs[i] !== 'string') return e;
    if (e.truncated && direction === 'left') {
      throw new ValidationError('truncation_direction left would cut the prompt this model pools without (include_prompt false): truncate on the right, or send a shorter text');
    }
    return { ids: e.ids, typeIds: e.typeIds, poolFrom };
  });
}

/** Slots a request needs: one per input. */
const timingOf = (rows: RequestRows): Timing => ({ queueMs: rows.queueMs, inferenceMs: rows.inferenceMs });

function callCount(inputs: CallInputs): number {
  switch (inputs.kind) {
    case 'inputs':
      return inputs.inputs.length;
    case 'pairs':
      return inputs.texts.length;
    case 'tokens':
      return inputs.tokens.length;
  }
}

// ------------------------------------------------------------ what the rows mean, per task

/** Row i of a request's rows (a view). */
export function rowOf(r: RequestRows, i: number): Float32Array {
  return r.rows.subarray(i * r.width, (i + 1) * r.width);
}

/**
 * The embeddings of an embed model's rows (views into them): L2-normalised as
 * the graph leaves them, or scaled back by the norm the graph keeps beside
 * each row (`normalize` false; default: the model's own setting).
 */
export function embeddings(model: ServedModel, r: RequestRows, normalize?: boolean): Float32Array[] {
  const dim = model.plan.spec.dimension;
  const keep = normalize ?? model.plan.spec.normalize;
  const out: Float32Array[] = new Array(r.rows.length / r.width);
  for (let i = 0; i < out.length; i++) {
    const row = rowOf(r, i);
    const v = row.subarray(0, dim);
    if (!keep) {
      const norm = row[dim]!; // the graph's second output: undo the normalisation
      for (let k = 0; k < dim; k++) v[k]! *= norm;
    }
    out[i] = v;
  }
  return out;
}

/** The classes of a classifier's rows: probabilities then logits, side by side in each row. */
export function classifications(model: ServedModel, r: RequestRows): Classification[] {
  const labels = model.plan.spec.labels;
  const n = labels.length;
  const out: Classification[] = new Array(r.rows.length / r.width);
  for (let i = 0; i < out.length; i++) {
    const row = rowOf(r, i);
    const probabilities = row.subarray(0, n);
    let best = 0;
    for (let k = 1; k < n; k++) if (probabilities[k]! > probabilities[best]!) best = k;
    out[i] = { label: labels[best]!, score: probabilities[best]!, probabilities, logits: row.subarray(n, 2 * n) };
  }
  return out;
}

/** A reranker's score of each pair, in input order: the sigmoid of its logit, or the logit (`raw`). The row is [sigmoid(logit), logit]. */
export function rerankScores(r: RequestRows, raw: boolean): RerankScore[] {
  const column = raw ? 1 : 0;
  const out: RerankScore[] = new Array(r.rows.length / r.width);
  for (let i = 0; i < out.length; i++) out[i] = { index: i, score: r.rows[i * r.width + column]! };
  return out;
}

/** Input i's token vectors (views of its copy): one Float32Array of tokenWidth floats per token. Needs a call with tokenRows. */
export function tokenVectors(r: RequestRows, i: number): Float32Array[] {
  const flat = r.tokens?.[i];
  const width = r.tokenWidth ?? 0;
  if (!flat || width === 0) throw new Error(`input ${i} has no token vectors: its call did not ask for them (tokenRows)`);
  return Array.from({ length: flat.length / width }, (_, t) => flat.subarray(t * width, (t + 1) * width));
}
