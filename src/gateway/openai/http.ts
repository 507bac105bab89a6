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
 * them. Token ids are OpenAI's, tiktoken's cl100k_base (what LangChain Python
 * sends by default): each list is decoded to its text, which is embedded as
 * text (cl100k.ts). `"token_encoding": "model"` (our extension) takes them as
 * the model's own ids instead, special tokens included, as TEI takes them;
 * --openai-token-ids model makes that the default.
 * `model` must name a loaded embedding model.
 * `encoding_format: "base64"` sends each vector as the base64 of its
 * little-endian float32 bytes, as OpenAI does (the official clients ask for
 * it by default and decode it). `dimensions` keeps the first N components and
 * L2-normalises them again (Matryoshka-style shortening). `embedding_type`
 * (our extension, Cohere's names: core/quantized-embeddings.ts) quantizes each vector,
 * after `dimensions`: integer lists, or with base64 the base64 of the row's
 * bytes (an int8 row's two's complement); msgpack answers carry the bytes.
 *
 * Errors are in OpenAI's shape, `{error: {message, type, param, code}}`, with
 * OpenAI's statuses: an invalid request is 400 (our 422), too long 400 with
 * code `context_length_exceeded`, an unknown model 404 with code
 * `model_not_found`; overload 429 (Retry-After), not ready 503.
 */
import { cutOf } from '../long-inputs.js';
import { statSync } from 'node:fs';
import { FieldValidationError, InvalidModelNameError, ModelNotFoundError, UnknownFieldError, ValidationError } from '../../shared/errors.js';
import { inputCount, inputList } from '../../core/inputs.js';
import { embeddings } from '../../core/rows.js';
import { type ServedModel } from '../../core/served-model.js';
import { floatAnswer, integerRowJson } from '../http/answers.js';
import { quantizeRow, rowBytes, type EmbeddingType, type QuantizedRow } from '../../core/quantized-embeddings.js';
import { float32RowsInJson } from '../http/float-json.js';
import { badRequestStatus, type Answer, type ErrorInfo, type RequestContext } from '../http/request-context.js';
import type { Route } from '../http/route-types.js';
import { OpenAIEmbeddingRequest, parseBody } from '../schemas.js';
import { prompted } from '../../core/prompts.js';
import { decodeCl100k } from './cl100k.js';
import { serveInference, type Endpoint } from '../serving.js';

/** Errors before a route runs (no key, too many connections, ...) in OpenAI's shape too. */
const fail = (ctx: RequestContext, err: unknown) => failOpenAI(ctx, err, err instanceof ValidationError ? 'input' : null);

/**
 * POST /v1/embeddings. The transport's deadline and priority (x-deadline-ms,
 * x-priority) apply; OpenAI's body has no such fields.
 */
const embeddingsEndpoint: Endpoint<{ base64: boolean; dimensions: number | undefined; type: EmbeddingType }> = {
  route: '/v1/embeddings',
  task: 'embed',
  parse(raw, ec) {
    const body = parseBody(OpenAIEmbeddingRequest, raw);
    const count = inputCount(body.input);
    if (count > ec.limits.maxClientBatchSize) {
      throw new FieldValidationError(`${count} inputs exceed the limit of ${ec.limits.maxClientBatchSize} per request (--max-client-batch-size)`, 'input');
    }
    const model = ec.infer.models.byName(body.model);
    const name = (ec.label.model = model.plan.spec.name);
    if (model.plan.spec.task !== 'embed') throw new FieldValidationError(`model "${name}" is a ${model.plan.spec.task} model, not an embedding model`, 'model');
    const dim = model.plan.spec.dimension;
    if (body.dimensions !== undefined && body.dimensions > dim) throw new FieldValidationError(`dimensions ${body.dimensions} exceeds model "${name}"'s ${dim}`, 'dimensions');
    const list = inputList(body.input);
    const inputs = (body.token_encoding ?? ec.limits.openaiTokenIds) === 'model' ? list : decodeCl100k(list);
    const call = prompted(
      {
        model,
        inputs: { kind: 'inputs' as const, inputs, ...cutOf(ec, model, { long: body.long_inputs, truncate: body.truncate }), direction: body.truncation_direction },
        timeoutMs: ec.timeoutMs,
        priority: ec.priority === undefined ? undefined : ec.infer.priorityIndex(ec.priority),
        cancel: ec.cancel,
      },
      body,
    );
    return { call, state: { base64: body.encoding_format === 'base64', dimensions: body.dimensions, type: body.embedding_type ?? 'float' } };
  },
  truncateAdvice: () => 'send "truncate": true (a slabserve extension to OpenAI\'s body) to cut it, or shorten the input',
  answer(r, call, state) {
    const rows = embeddings(call.model, r.rows).map((full) => (state.dimensions !== undefined ? shorten(full, state.dimensions) : full));
    const model = call.model.plan.spec.name;
    // windows: our extension, where an input was chunked (docs/long-inputs.md)
    const usage = { prompt_tokens: r.tokens, total_tokens: r.tokens, ...(r.windows !== undefined ? { windows: r.windows } : {}) };
    const type = state.type;
    if (type !== 'float') return quantizedListAnswer(rows.map((v) => quantizeRow(v, type)), model, usage, state.base64);
    if (state.base64) {
      return { object: 'list', data: rows.map((v, index) => ({ object: 'embedding', index, embedding: float32Base64(v) })), model, usage };
    }
    return embeddingListAnswer(rows, model, usage);
  },
};

export const openaiRoutes: Route[] = [
  { method: 'post', path: '/v1/embeddings', fail, handle: (ctx, deps) => serveInference(ctx, deps, embeddingsEndpoint, fail) },
  { method: 'get', path: '/v1/models', fail, handle: (ctx, deps) => ctx.send(200, { object: 'list', data: deps.infer.models.list().map(modelObject) }) },
  {
    method: 'get',
    path: '/v1/models/:id',
    fail,
    handle: (ctx, deps, [id]) => {
      try {
        ctx.send(200, modelObject(deps.infer.models.byName(id!)));
      } catch (err) {
        failOpenAI(ctx, err, 'model');
      }
    },
  },
];

const created = new Map<string, number>();
/** A model as OpenAI lists it; `created` is its model file's time (seconds), the nearest thing to a release date. */
function modelObject(m: ServedModel): { id: string; object: 'model'; created: number; owned_by: string } {
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

/**
 * OpenAI's list of float embeddings, each component the shortest decimal
 * that reads back to its float32 (as /embed writes them, and as the base64
 * form's bytes decode), not the 17-digit double it widens to.
 */
function embeddingListAnswer(rows: Float32Array[], model: string, usage: { prompt_tokens: number; total_tokens: number }): Answer & { value(): unknown } {
  const value = () => ({ object: 'list', data: rows.map((v, index) => ({ object: 'embedding', index, embedding: Array.from(v) })), model, usage });
  return floatAnswer(value, () => {
    const pieces = ['{"object":"list","data":['];
    for (let i = 0; i < rows.length; i++) {
      pieces[i] += `${i > 0 ? ',' : ''}{"object":"embedding","index":${i},"embedding":`;
      pieces.push('}');
    }
    pieces[rows.length] += `],"model":${JSON.stringify(model)},"usage":${JSON.stringify(usage)}}`;
    return float32RowsInJson(pieces, rows);
  });
}

/**
 * OpenAI's list of quantized embeddings: integer lists, or the base64 of
 * each row's bytes; in msgpack (and `value()`) each row's bytes as `bin`.
 */
function quantizedListAnswer(rows: QuantizedRow[], model: string, usage: { prompt_tokens: number; total_tokens: number }, base64: boolean): unknown {
  const list = (embedding: (q: QuantizedRow) => unknown) => ({ object: 'list', data: rows.map((q, index) => ({ object: 'embedding', index, embedding: embedding(q) })), model, usage });
  if (base64) return list((q) => Buffer.from(q.buffer, q.byteOffset, q.byteLength).toString('base64'));
  return floatAnswer(
    () => list(rowBytes),
    () => {
      const data = rows.map((q, i) => `{"object":"embedding","index":${i},"embedding":${integerRowJson(q)}}`);
      return `{"object":"list","data":[${data.join(',')}],"model":${JSON.stringify(model)},"usage":${JSON.stringify(usage)}}`;
    },
  );
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

/** OpenAI's words for a field it does not take, with our hint; else our message. */
function openaiMessage(info: ErrorInfo): string {
  const err = info.err;
  if (!(err instanceof UnknownFieldError)) return info.message;
  return `Unrecognized request argument supplied: ${err.field}${err.suggestion !== null ? ` (did you mean "${err.suggestion}"?)` : ''}`;
}

/** Answers `err` as OpenAI does: `{error: {message, type, param, code}}`. */
export function failOpenAI(ctx: RequestContext, err: unknown, param: string | null = null): number {
  return ctx.fail(
    err,
    (info) => {
      const status = badRequestStatus(info);
      return { error: { message: openaiMessage(info), type: openaiType(status), param: openaiParam(info, param), code: openaiCode(info) } };
    },
    badRequestStatus,
  );
}
