/**
 * The API operations, independent of the transport: HTTP routes and the
 * WebSocket protocol both validate a request body with the same schema and
 * call these, so `/embed` over HTTP and `{op: "embed"}` over /ws answer the
 * same thing.
 */
import { nowMs } from '../shared/clock.js';
import { ValidationError } from '../shared/errors.js';
import type { Task } from '../shared/model-config.js';
import { inputCount, isSingleInput, type ClientModel, type InferenceClient, type Inputs, type Timing } from './inference-client.js';
import type { GatewayLimits } from './routes.js';
import { DecodeRequest, EmbedRequest, parseBody, PredictRequest, RerankRequest, TokenizeRequest } from './schemas.js';

export interface OperationOptions {
  signal?: AbortSignal;
  /** Ms from now after which the request must not run (x-deadline-ms, deadline_ms). */
  timeoutMs?: number;
  /** Priority class name (x-priority). */
  priority?: string;
  /** A model named outside the body (the URL path); must agree with the body's. */
  pathModel?: string;
  /** embed only: rows as little-endian float32 bytes instead of number arrays. */
  f32?: boolean;
  /** Told the model as soon as it is resolved (so a request that fails later is still logged with it). */
  onModel?: (model: ClientModel) => void;
}

export interface OperationResult {
  payload: unknown;
  model: ClientModel;
  /** Inputs in the request (slots used). */
  inputs: number;
  tokenizeMs: number;
  timing: Timing;
}

export type Operation = (client: InferenceClient, limits: GatewayLimits, body: unknown, opts: OperationOptions) => Promise<OperationResult>;

/** Checks the request's size and picks its model. */
function prepare(client: InferenceClient, limits: GatewayLimits, task: Task | null, inputs: Inputs, bodyModel: string | undefined, pathModel: string | undefined) {
  if (pathModel !== undefined && bodyModel !== undefined && bodyModel !== pathModel) {
    throw new ValidationError(`the path names model "${pathModel}" but the body names "${bodyModel}"`);
  }
  const count = inputCount(inputs); // a flat list of token ids is one input
  if (count > limits.maxClientBatchSize) {
    throw new ValidationError(`${count} inputs exceed the limit of ${limits.maxClientBatchSize} per request (--max-client-batch-size)`);
  }
  const name = pathModel ?? bodyModel;
  return { model: task === null ? client.anyModel(name) : client.resolve(task, name), count };
}

/** The call's cancellation, deadline and priority: the body's `timeout` / `priority` win over the transport's. */
function callOptions(client: InferenceClient, opts: OperationOptions, body: { timeout?: number | undefined; priority?: string | undefined } = {}) {
  const timeoutMs = body.timeout ?? opts.timeoutMs;
  const priority = body.priority ?? opts.priority;
  return {
    ...(opts.signal ? { signal: opts.signal } : {}),
    ...(timeoutMs !== undefined ? { timeoutMs } : {}),
    ...(priority !== undefined ? { priority: client.priorityIndex(priority) } : {}),
  };
}

// Inference operations take their slots (client.withSlots: all of them, or 429 at once) before
// tokenizing, so a request that would be refused costs no tokenizing, and never waits for the
// tokenizer pool only to be refused after it.

export const embedOperation: Operation = async (client, limits, raw, opts) => {
  const body = parseBody(EmbedRequest, raw);
  const { model, count } = prepare(client, limits, 'embed', body.inputs, body.model, opts.pathModel);
  opts.onModel?.(model);
  return client.withSlots(model, count, callOptions(client, opts, body), async (call) => {
    const t0 = nowMs();
    const encodings = await client.encodeInputs(model, body.inputs, body.truncate ?? false, call.signal);
    const tokenizeMs = nowMs() - t0;
    const r = await client.embed(model, encodings, { ...call, ...(body.normalize !== undefined ? { normalize: body.normalize } : {}) });
    const payload = opts.f32 ? r.vectors.map((v) => new Uint8Array(v.buffer, v.byteOffset, v.byteLength)) : r.vectors.map((v) => Array.from(v));
    return { payload, model, inputs: count, tokenizeMs, timing: r.timing };
  });
};

export const predictOperation: Operation = async (client, limits, raw, opts) => {
  const body = parseBody(PredictRequest, raw);
  const { model, count } = prepare(client, limits, 'classify', body.inputs, body.model, opts.pathModel);
  opts.onModel?.(model);
  return client.withSlots(model, count, callOptions(client, opts, body), async (call) => {
    const t0 = nowMs();
    const encodings = await client.encodeInputs(model, body.inputs, body.truncate ?? false, call.signal);
    const tokenizeMs = nowMs() - t0;
    const r = await client.classify(model, encodings, call);
    const lists = r.classes.map((c) => labelScores(model, c, body.raw_scores ?? false));
    return { payload: isSingleInput(body.inputs) ? lists[0] : lists, model, inputs: count, tokenizeMs, timing: r.timing };
  });
};

/** [{label, score}] sorted by score, highest first: probabilities, or logits with raw_scores. */
export function labelScores(model: ClientModel, c: { probabilities: Float32Array; logits: Float32Array }, raw: boolean): { label: string; score: number }[] {
  const values = raw ? c.logits : c.probabilities;
  return model.plan.spec.labels.map((label, i) => ({ label, score: values[i]! })).sort((a, b) => b.score - a.score);
}

const NO_TIMING: Timing = { queueMs: 0, inferenceMs: 0 };

/**
 * TEI's rerank: `{query, texts, raw_scores?, return_text?, truncate?, model?}`
 * -> `[{index, score, text?}]`, highest score first. Each (query, text) pair
 * is one input of a cross-encoder (a `rerank` model).
 */
export const rerankOperation: Operation = async (client, limits, raw, opts) => {
  const body = parseBody(RerankRequest, raw);
  const { model, count } = prepare(client, limits, 'rerank', body.texts, body.model, opts.pathModel);
  opts.onModel?.(model);
  return client.withSlots(model, count, callOptions(client, opts, body), async (call) => {
    const t0 = nowMs();
    const encodings = await client.encodePairs(model, body.query, body.texts, body.truncate ?? false);
    const tokenizeMs = nowMs() - t0;
    const r = await client.rerankEncoded(model, encodings, { ...call, rawScores: body.raw_scores ?? false });
    const ranked = r.scores
      .map((s) => (body.return_text ? { index: s.index, score: s.score, text: body.texts[s.index]! } : { index: s.index, score: s.score }))
      .sort((a, b) => b.score - a.score || a.index - b.index);
    return { payload: ranked, model, inputs: count, tokenizeMs, timing: r.timing };
  });
};

/** Most characters one tokenize request may hold: about 0.1 s of the gateway's event loop. */
export const MAX_TOKENIZE_CHARS = 65_536;

/**
 * TEI's tokenize: `{inputs, add_special_tokens?, model?}` -> per input, a list
 * of `{id, text, special, start, stop}` (offsets in code points; null for
 * the special tokens). Always a list of lists, as TEI answers. No inference.
 */
export const tokenizeOperation: Operation = async (client, limits, raw, opts) => {
  const body = parseBody(TokenizeRequest, raw);
  const { model, count } = prepare(client, limits, null, body.inputs, body.model, opts.pathModel);
  opts.onModel?.(model);
  const tok = model.tokenizer;
  if (!tok.tokenize) throw new ValidationError(`model "${model.plan.spec.name}"'s tokenizer cannot report tokens`);
  const texts = typeof body.inputs === 'string' ? [body.inputs] : body.inputs;
  const chars = texts.reduce((n, t) => n + t.length, 0);
  if (chars > MAX_TOKENIZE_CHARS) {
    throw new ValidationError(`${chars} characters to tokenize; at most ${MAX_TOKENIZE_CHARS} per request (tokens and offsets are computed on the gateway's event loop)`);
  }
  const t0 = nowMs();
  const payload = texts.map((t) => tok.tokenize!(t, body.add_special_tokens ?? true));
  return { payload, model, inputs: count, tokenizeMs: nowMs() - t0, timing: NO_TIMING };
};

/**
 * TEI's decode: `{ids, skip_special_tokens?, model?}` -> a string for one list
 * of ids, a list of strings for a list of lists. No inference.
 */
export const decodeOperation: Operation = async (client, limits, raw, opts) => {
  const body = parseBody(DecodeRequest, raw);
  const single = body.ids.length === 0 || typeof body.ids[0] === 'number';
  const lists = (single ? [body.ids] : body.ids) as number[][];
  const { model, count } = prepare(client, limits, null, lists, body.model, opts.pathModel);
  opts.onModel?.(model);
  const vocab = model.tokenizer.vocabSize;
  for (const list of lists) {
    for (const id of list) if (id >= vocab) throw new ValidationError(`token id ${id} is not in [0, ${vocab})`);
  }
  const t0 = nowMs();
  const texts = lists.map((l) => model.tokenizer.decode(l, body.skip_special_tokens ?? true));
  return { payload: single ? texts[0] : texts, model, inputs: count, tokenizeMs: nowMs() - t0, timing: NO_TIMING };
};

/** The operations beyond embed and predict, by op name (for the WebSocket API's `operations`). */
export const teiOperations: Record<string, Operation> = {
  rerank: rerankOperation,
  tokenize: tokenizeOperation,
  decode: decodeOperation,
};
