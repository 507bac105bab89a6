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
 * Its parts: the inputs (inputs.ts), tokenize and validate (encoder.ts), what
 * the rows mean per task (rows.ts); answer shapes are the dialects' business (routes*.ts, src/gateway/ws/api.ts, the engine). Transport-free.
 */
import type { SpanIds } from '../shared/trace-context.js';
import { Admission } from './admission.js';
import type { Cancellation } from './cancel.js';
import { nowMs } from '../shared/clock.js';
import { DeadlineExceededError, ModelNotFoundError, OutputUnavailableError, OverloadedError, ValidationError, WrongTaskError } from '../shared/errors.js';
import { checkModelName, type ModelOutput, type Task } from '../shared/model-format/model-config.js';
import { fillMissing, lookUp, type ResultCache } from '../shared/result-cache.js';
import type { RequestRows, SlabSubmitter } from './submitter.js';
import type { SlotReservation } from '../shared/slab.js';
import { partSizeFor, submitInParts } from './client-batches.js';
import { DEFAULTS } from '../shared/options.js';
import { Encoder, type BatchTokenizer } from './encoder.js';
import type { CallInputs, Tokens } from './inputs.js';
import { isChunked, type Windowed } from './long-inputs.js';
import { combineRows, type Combine } from './window-rows.js';
import type { ServedModel } from './served-model.js';
import type { ModelRegistry } from './model-registry.js';


export interface Timing {
  /** Longest any of the request's inputs waited for its batch, ms. */
  queueMs: number;
  /** Longest batch run among the request's inputs, ms. */
  inferenceMs: number;
}

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
  /** Where an input was chunked (long-inputs.ts): the windows the request ran, every input's counted (one that fits is one). */
  windows?: number;
}

/** What a request runs: its inputs' tokens, or its windows' and whose they are. */
interface Tokenized {
  tokens: Tokens[];
  windows: Windowed | null;
}

/** How an input's windows' rows become its row: by its pooling, or a reranker's best window. */
function combineOf(model: ServedModel): Combine {
  const spec = model.plan.spec;
  return spec.task === 'rerank' ? { task: 'rerank' } : { task: 'embed', pooling: spec.pooling, dimension: spec.dimension };
}

export class Infer {
  /** The models this owner serves, by id, name and task. */
  readonly models: ModelRegistry;
  private readonly submitter: SlabSubmitter;
  /** A request's deadline when it names none (--request-timeout-ms). */
  readonly requestTimeoutMs: number;
  /** Latency target (--slo-p99-ms): admission refuses work that cannot meet it. */
  private readonly sloP99Ms: number | undefined;
  /** Priority class names, by index (default interactive, bulk). */
  private readonly priorityNames: readonly string[];
  /** Told of every request that ran but finished past its deadline (work wasted). */
  private readonly onLate: ((model: number, tokens: number) => void) | undefined;
  /** Tokenize and validate: inline or on the tokenizer pool. */
  readonly encoder: Encoder;
  /** Slots held and work refused before it waits: the request's admission. */
  private readonly admission: Admission<SlotReservation>;
  /** The result cache (--cache-mb), or null: off. */
  private readonly cache: ResultCache | null;

  constructor(
    models: ModelRegistry,
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
    this.encoder = new Encoder({ batchTokenizer: opts.batchTokenizer, inlineTokenizeChars: opts.inlineTokenizeChars ?? DEFAULTS.inlineTokenizeChars });
    this.cache = opts.cache ?? null;
    this.admission = new Admission(submitter, this.sloP99Ms);
  }

  /** The index of a priority class by name ("interactive", "bulk", ...). */
  /** The priority classes, highest first (--priority-weights). */
  get priorityClasses(): readonly string[] {
    return this.priorityNames;
  }

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
    let held = cache && this.tokenizedInline(model, call.inputs) ? null : this.admission.hold(model, count, timeoutMs, tokenRows);
    try {
      const t0 = nowMs();
      const pending = this.tokenized(model, call.inputs, call.cancel);
      const { tokens, windows } = pending instanceof Promise ? await pending : pending; // no extra turn when inline
      const tokenizeMs = nowMs() - t0;
      if (tokens.length > partSize) throw new ValidationError(`${count} inputs took ${tokens.length} windows; one request runs at most ${partSize} for model "${spec.name}": send fewer or shorter inputs`);
      const index = model.plan.index;
      const width = model.plan.layout.outputWidth;
      const look = cache ? lookUp(cache, index, tokens, width) : null;
      let rows: RequestRows;
      if (look && look.missing.length === 0) {
        rows = { rows: look.rows, width, queueMs: 0, inferenceMs: 0 }; // answered here: no slot, no queue, no run
      } else {
        const run = look ? look.missing.map((i) => tokens[i]!) : tokens;
        held ??= this.admission.hold(model, run.length, timeoutMs, tokenRows);
        this.admission.grow(held, model, run.length, tokenRows);
        this.admission.admitWait(this.submitter.predictedWaitMs(index, run), timeoutMs);
        rows = await this.submitter.submitRequest(index, run, { deadline, priority: call.priority, cancel: call.cancel, reservation: held, trace: call.trace });
        if (look) rows = { ...rows, rows: fillMissing(cache!, index, tokens, look, rows.rows, width) };
      }
      if (windows) rows = combineRows(rows, windows, combineOf(model));
      let tokenCount = 0;
      for (const t of tokens) tokenCount += t.ids.length;
      return this.answered(model, deadline, {
        rows,
        tokens: tokenCount,
        tokenizeMs,
        timing: timingOf(rows),
        ...(look ? { cache: look.missing.length === 0 ? 'hit' : 'miss' } : {}),
        ...(tokenRows ? { inputIds: (windows ? windows.whole : tokens).map((t) => t.ids) } : {}),
        ...(windows ? { windows: tokens.length } : {}),
      });
    } finally {
      held?.release();
    }
  }

  /**
   * The tokens a request runs: its inputs', or with chunking (long-inputs.ts)
   * its windows', and then `windows` says whose they are. Chunking applies to
   * embeddings (ColBERT documents too; queries are cut, as PyLate cuts them) and rerank pairs.
   */
  private tokenized(model: ServedModel, inputs: CallInputs, cancel: Cancellation | undefined): Tokenized | Promise<Tokenized> {
    const task = model.plan.spec.task;
    const split = (w: Windowed): Tokenized => ({ tokens: w.tokens, windows: isChunked(w) ? w : null });
    if (inputs.kind === 'inputs' && inputs.chunk && task === 'embed' && inputs.colbert !== 'query') {
      const w = this.encoder.inputWindows(model, inputs, inputs.chunk, cancel);
      return w instanceof Promise ? w.then(split) : split(w);
    }
    if (inputs.kind === 'pairs' && inputs.chunk && task === 'rerank') return this.encoder.pairWindows(model, inputs, inputs.chunk).then(split);
    if (inputs.kind === 'tokens' && inputs.chunk && task === 'embed') return split(this.encoder.tokenWindows(model, inputs.tokens, inputs.chunk));
    const tokens = this.encoder.tokenize(model, inputs, cancel);
    return tokens instanceof Promise ? tokens.then((t) => ({ tokens: t, windows: null })) : { tokens, windows: null };
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
    const first = cache ? undefined : this.admission.hold(model, partSize, timeoutMs);
    const spent = { tokenizeMs: 0, tokens: 0 };
    try {
      // Texts and ids are tokenized part by part; pairs and KServe tensors at once (then sliced).
      const inputs = call.inputs;
      const texts = inputs.kind === 'inputs' ? inputs : null;
      const whole = texts ? null : await this.encoder.tokenize(model, inputs, call.cancel);
      const prepare = async (from: number, to: number, cancel: Cancellation): Promise<Tokens[]> => {
        const t0 = nowMs();
        const tokens = texts ? await this.encoder.tokenize(model, { ...texts, inputs: texts.inputs.slice(from, to) }, cancel) : whole!.slice(from, to);
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
        admit: (xs) => this.admission.admitWait(this.submitter.predictedWaitMs(index, xs), timeoutMs),
        cache: cache ? { lookUp: (xs) => lookUp(cache, index, xs, width), fill: (xs, look, ran) => fillMissing(cache, index, xs, look, ran, width) } : undefined,
        first,
        takeFirst: (n) => this.admission.hold(model, n, timeoutMs),
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
   * already) rather than on the tokenizer pool: the rule of Encoder.encodeTexts (the
   * pool takes what does not fit inline, fitsInline), and pairs that fit.
   */
  private tokenizedInline(model: ServedModel, inputs: CallInputs): boolean {
    switch (inputs.kind) {
      case 'tokens':
        return true;
      case 'inputs':
        return !this.encoder.pooled || this.encoder.fitsInline(model, inputs.inputs);
      case 'pairs':
        return this.encoder.fitsInline(model, [...inputs.queries, ...inputs.texts]);
    }
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
      const m = this.models.list().find((x) => x.plan.spec.name === pathModel);
      if (!m || (task !== null && m.plan.spec.task !== task)) return null;
      candidates = [m];
    } else {
      candidates = task === null ? this.models.list() : this.models.modelsOf(task);
      if (candidates.length === 0) return null;
    }
    const error = this.admission.refusalOf(candidates, (m) => this.mayHit(m));
    return error ? { error, model: candidates.length === 1 ? candidates[0]!.plan.spec.name : undefined } : null;
  }

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
