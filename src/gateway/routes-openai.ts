/**
 * OpenAI's embeddings API, so OpenAI clients (the official SDKs, LangChain,
 * LlamaIndex, ...) can use slabserve by changing their base URL to `/v1`:
 *
 *   POST /v1/embeddings    {input, model, encoding_format?, dimensions?, user?}
 *                          -> {object: "list", data: [{object: "embedding", index, embedding}], model, usage}
 *   GET  /v1/models        -> {object: "list", data: [{id, object: "model", created, owned_by: "slabserve"}]}
 *   GET  /v1/models/{id}   -> one of those
 *
 * `input` is a string, a list of strings, one list of token ids or a list of
 * them. Token ids are the model's own, special tokens included (as TEI takes
 * them), not tiktoken's. `model` must name a loaded embedding model.
 * `encoding_format: "base64"` sends each vector as the base64 of its
 * little-endian float32 bytes, as OpenAI does (the official clients ask for
 * it by default and decode it). `dimensions` keeps the first N components and
 * L2-normalises them again (Matryoshka-style shortening).
 *
 * Errors are in OpenAI's shape, `{error: {message, type, param, code}}`, with
 * OpenAI's statuses: an invalid request is 400 (our 422), too long 400 with
 * code `context_length_exceeded`, an unknown model 404 with code
 * `model_not_found`; overload 429 (Retry-After), not ready 503.
 */
import { statSync } from 'node:fs';
import { ModelNotFoundError, ValidationError } from '../shared/errors.js';
import { inputCount, type ClientModel } from './inference-client.js';
import type { RequestContext } from './http.js';
import { errorInfo, headerCall, observe, refuseBeforeBody, timingHeaders, type ErrorInfo } from './route-util.js';
import type { Route, RouteDeps } from './routes.js';
import { FieldValidationError, OpenAIEmbeddingRequest, parseBody } from './schemas.js';
import { InvalidModelNameError } from './security.js';

const ROUTE = '/v1/embeddings';

/** Errors before a route runs (no key, too many connections, ...) in OpenAI's shape too. */
const fail = (ctx: RequestContext, err: unknown) => failOpenAI(ctx, err);

export const openaiRoutes: Route[] = [
  { method: 'post', path: '/v1/embeddings', fail, handle: (ctx, deps) => embeddings(ctx, deps) },
  { method: 'get', path: '/v1/models', fail, handle: (ctx, deps) => ctx.send(200, { object: 'list', data: deps.client.list().map(modelObject) }) },
  {
    method: 'get',
    path: '/v1/models/:id',
    fail,
    handle: (ctx, deps, [id]) => {
      try {
        ctx.send(200, modelObject(deps.client.byName(id!)));
      } catch (err) {
        failOpenAI(ctx, err, 'model');
      }
    },
  },
];

const created = new Map<string, number>();
/** A model as OpenAI lists it; `created` is its model file's time (seconds), the nearest thing to a release date. */
function modelObject(m: ClientModel): { id: string; object: 'model'; created: number; owned_by: string } {
  const name = m.plan.spec.name;
  let t = created.get(name);
  if (t === undefined) {
    try {
      t = Math.floor(statSync(m.plan.spec.onnxPath).mtimeMs / 1000);
    } catch {
      t = 0;
    }
    created.set(name, t);
  }
  return { id: name, object: 'model', created: t, owned_by: 'slabserve' };
}

async function embeddings(ctx: RequestContext, deps: RouteDeps): Promise<void> {
  const label = { model: 'unknown' };
  let modelName = 'unknown';
  try {
    // Not ready, or no embedding model with a free slot: refused before the body is read.
    refuseBeforeBody(deps, 'embed', undefined, label);
    const raw = await ctx.readPayload(deps.limits.maxBodyBytes);
    const body = parseBody(OpenAIEmbeddingRequest, raw);
    const count = inputCount(body.input);
    if (count > deps.limits.maxClientBatchSize) {
      throw new FieldValidationError(`${count} inputs exceed the limit of ${deps.limits.maxClientBatchSize} per request (--max-client-batch-size)`, 'input');
    }
    const model = deps.client.byName(body.model);
    modelName = model.plan.spec.name;
    ctx.model = modelName;
    if (model.plan.spec.task !== 'embed') {
      throw new FieldValidationError(`model "${modelName}" is a ${model.plan.spec.task} model, not an embedding model`, 'model');
    }
    const dim = model.plan.spec.hiddenSize;
    if (body.dimensions !== undefined && body.dimensions > dim) {
      throw new FieldValidationError(`dimensions ${body.dimensions} exceeds model "${modelName}"'s ${dim}`, 'dimensions');
    }
    deps.metrics.inputs.inc({ model: modelName, route: ROUTE }, count);

    // Slots first (429 at once when they are not free), then tokenizing.
    const { r, encodings, tokenizeMs } = await deps.client.withSlots(model, count, headerCall(ctx, deps.client), async (call) => {
      const t0 = performance.now();
      const encodings = await deps.client.encodeInputs(model, body.input, false, call.signal);
      const tokenizeMs = performance.now() - t0;
      return { r: await deps.client.embed(model, encodings, call), encodings, tokenizeMs };
    });
    let tokens = 0;
    for (const e of encodings) tokens += e.ids.length;
    const base64 = body.encoding_format === 'base64';
    const data = r.vectors.map((full, index) => {
      const v = body.dimensions !== undefined ? shorten(full, body.dimensions) : full;
      return { object: 'embedding' as const, index, embedding: base64 ? float32Base64(v) : Array.from(v) };
    });
    deps.metrics.queueDuration.observe({ model: modelName }, r.timing.queueMs / 1000);
    ctx.send(200, { object: 'list', data, model: modelName, usage: { prompt_tokens: tokens, total_tokens: tokens } }, timingHeaders(ctx, tokenizeMs, r.timing));
    observe(deps, ctx, ROUTE, modelName, 200);
  } catch (err) {
    if (modelName === 'unknown') modelName = label.model;
    observe(deps, ctx, ROUTE, modelName, openaiStatus(errorInfo(err)), err);
    failOpenAI(ctx, err, err instanceof ValidationError ? 'input' : null);
  }
}

/** The first `n` components, L2-normalised again. */
export function shorten(v: Float32Array, n: number): Float32Array {
  const out = v.slice(0, n);
  let sum = 0;
  for (let i = 0; i < n; i++) sum += out[i]! * out[i]!;
  const norm = Math.sqrt(sum);
  if (norm > 0) for (let i = 0; i < n; i++) out[i]! /= norm;
  return out;
}

/** Little-endian float32 bytes in base64, as OpenAI sends `encoding_format: "base64"`. */
export function float32Base64(v: Float32Array): string {
  const bytes = Buffer.alloc(v.length * 4);
  for (let i = 0; i < v.length; i++) bytes.writeFloatLE(v[i]!, i * 4);
  return bytes.toString('base64');
}

// ------------------------------------------------------------ errors in OpenAI's shape

/** OpenAI's status for our error: invalid requests and too-long inputs are 400 there. */
function openaiStatus(info: ErrorInfo): number {
  if (info.type === 'validation' && info.status === 422) return 400;
  if (info.type === 'too_long' && info.status === 413 && info.code === 'SLABSERVE_INPUT_TOO_LONG') return 400;
  return info.status;
}

function openaiType(status: number): string {
  if (status === 429) return 'rate_limit_error';
  if (status >= 500) return 'server_error';
  return 'invalid_request_error';
}

function openaiCode(info: ErrorInfo): string {
  if (info.err instanceof ModelNotFoundError || info.err instanceof InvalidModelNameError) return 'model_not_found';
  if (info.code === 'SLABSERVE_UNAUTHORIZED') return 'invalid_api_key';
  if (info.code === 'SLABSERVE_INPUT_TOO_LONG') return 'context_length_exceeded';
  if (info.code === 'SLABSERVE_OVERLOADED') return 'rate_limit_exceeded';
  return info.code;
}

function openaiParam(info: ErrorInfo, fallback: string | null): string | null {
  if (info.err instanceof FieldValidationError) return info.err.param;
  if (info.err instanceof ModelNotFoundError || info.err instanceof InvalidModelNameError) return 'model';
  if (info.code === 'SLABSERVE_INPUT_TOO_LONG') return 'input';
  return fallback;
}

/** Answers `err` as OpenAI does: `{error: {message, type, param, code}}`. */
export function failOpenAI(ctx: RequestContext, err: unknown, param: string | null = null): void {
  ctx.fail(
    err,
    (info) => {
      const status = openaiStatus(info);
      return { error: { message: info.message, type: openaiType(status), param: openaiParam(info, param), code: openaiCode(info) } };
    },
    openaiStatus,
  );
}
