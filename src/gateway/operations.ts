/**
 * The API operations, independent of the transport: HTTP routes and the
 * WebSocket protocol both validate a request body with the same schema and
 * call these, so `/embed` over HTTP and `{op: "embed"}` over /ws answer the
 * same thing.
 */
import { nowMs } from '../shared/clock.js';
import { ValidationError } from '../shared/errors.js';
import type { Task } from '../shared/model-config.js';
import type { ClientModel, InferenceClient, Timing } from './inference-client.js';
import type { GatewayLimits } from './routes.js';
import { EmbedRequest, parseBody, PredictRequest } from './schemas.js';

export interface OperationOptions {
  signal?: AbortSignal;
  /** Ms from now after which the request must not run. */
  timeoutMs?: number;
  /** A model named outside the body (the URL path); must agree with the body's. */
  pathModel?: string;
  /** embed only: rows as little-endian float32 bytes instead of number arrays. */
  f32?: boolean;
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
function prepare(client: InferenceClient, limits: GatewayLimits, task: Task, inputs: unknown[] | string, bodyModel: string | undefined, pathModel: string | undefined) {
  if (pathModel !== undefined && bodyModel !== undefined && bodyModel !== pathModel) {
    throw new ValidationError(`the path names model "${pathModel}" but the body names "${bodyModel}"`);
  }
  const count = typeof inputs === 'string' ? 1 : inputs.length;
  if (count > limits.maxClientBatchSize) {
    throw new ValidationError(`${count} inputs exceed the limit of ${limits.maxClientBatchSize} per request (--max-client-batch-size)`);
  }
  return { model: client.resolve(task, pathModel ?? bodyModel), count };
}

const callOptions = (opts: OperationOptions) => ({
  ...(opts.signal ? { signal: opts.signal } : {}),
  ...(opts.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : {}),
});

export const embedOperation: Operation = async (client, limits, raw, opts) => {
  const body = parseBody(EmbedRequest, raw);
  const { model, count } = prepare(client, limits, 'embed', body.inputs, body.model, opts.pathModel);
  const t0 = nowMs();
  const encodings = await client.encode(model, body.inputs, body.truncate ?? false);
  const tokenizeMs = nowMs() - t0;
  const r = await client.embed(model, encodings, { ...callOptions(opts), ...(body.normalize !== undefined ? { normalize: body.normalize } : {}) });
  const payload = opts.f32 ? r.vectors.map((v) => new Uint8Array(v.buffer, v.byteOffset, v.byteLength)) : r.vectors.map((v) => Array.from(v));
  return { payload, model, inputs: count, tokenizeMs, timing: r.timing };
};

export const predictOperation: Operation = async (client, limits, raw, opts) => {
  const body = parseBody(PredictRequest, raw);
  const { model, count } = prepare(client, limits, 'classify', body.inputs, body.model, opts.pathModel);
  const t0 = nowMs();
  const encodings = await client.encode(model, body.inputs, body.truncate ?? false);
  const tokenizeMs = nowMs() - t0;
  const r = await client.classify(model, encodings, callOptions(opts));
  const lists = r.classes.map((c) => labelScores(model, c, body.raw_scores ?? false));
  return { payload: typeof body.inputs === 'string' ? lists[0] : lists, model, inputs: count, tokenizeMs, timing: r.timing };
};

/** [{label, score}] sorted by score, highest first: probabilities, or logits with raw_scores. */
export function labelScores(model: ClientModel, c: { probabilities: Float32Array; logits: Float32Array }, raw: boolean): { label: string; score: number }[] {
  const values = raw ? c.logits : c.probabilities;
  return model.plan.spec.labels.map((label, i) => ({ label, score: values[i]! })).sort((a, b) => b.score - a.score);
}
