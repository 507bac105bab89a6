/**
 * vLLM's pooling routes, as its frontend's scoring and classify protocols
 * define them (vllm/frontend/entrypoints/pooling/), so clients written for a
 * vLLM server of a cross-encoder, an embedding model or a classifier work:
 *
 *   POST /score, /v1/score  {model?, queries, documents} (or text_1/text_2, queries/items, data_1/data_2),
 *                           truncate_prompt_tokens?, truncation_side?, use_activation?, max_tokens_per_query?, max_tokens_per_doc?, priority?, ...}
 *                           -> {id, object: "list", created, model, data: [{index, object: "score", score}], usage}
 *   POST /classify, /v1/classify  {model?, input, truncate_prompt_tokens?, truncation_side?, use_activation?, priority?, ...}
 *                           -> {id, object: "list", created, model, data: [{index, label, probs, num_classes}], usage}
 *
 * Score pairs as vLLM pairs them: one to one, one to many (the first side one
 * text) or N to N pairwise; other lengths are a 400. A cross-encoder's score is
 * the sigmoid of its logit (use_activation false: the logit); an embedding
 * model's the cosine of the two texts' embeddings, as vLLM scores with one.
 * /classify's probs are the softmax of the logits (use_activation false: the
 * logits), its label the most likely.
 *
 * truncate_prompt_tokens -1 cuts an input to the model's length, N to N tokens
 * (truncation_side: which end; a pair is cut longest side first); absent,
 * --truncate decides, as on our routes. A field vLLM takes that has no use here
 * (request_id, user, instruction, ...) is accepted and ignored, and so is an
 * unknown one, as vLLM does. `priority` (vLLM's integer, lower earlier) picks
 * the class of that rank; x-deadline-ms and x-priority apply.
 *
 * Errors are vLLM's shape, `{error: {message, type, param, code}}` with the
 * status as `code`; an invalid request is 400 (our 422).
 */
import { cutOf } from '../long-inputs.js';
import { randomUUID } from 'node:crypto';
import { FieldValidationError, ValidationError } from '../../shared/errors.js';
import type { InferCall, InferResult } from '../../core/infer.js';
import { inputCount, inputList } from '../../core/inputs.js';
import { classifications, embeddings, rerankScores } from '../../core/rows.js';
import type { ServedModel } from '../../core/served-model.js';
import { badRequestStatus, type RequestContext } from '../http/request-context.js';
import type { Route } from '../http/route-types.js';
import { parseBody, VllmClassifyRequest, VllmScoreRequest, type ScoreInput } from '../schemas.js';
import { priorityOfRank, serveInference, type Endpoint, type EndpointContext, type Fail } from '../serving.js';

// ------------------------------------------------------------ errors in vLLM's shape

const TYPE_OF_STATUS: Record<number, string> = {
  400: 'BadRequestError',
  401: 'UnauthorizedError',
  404: 'NotFoundError',
  405: 'MethodNotAllowedError',
  413: 'PayloadTooLargeError',
  415: 'UnsupportedMediaTypeError',
  424: 'BadRequestError',
  429: 'TooManyRequestsError',
  499: 'ClientClosedRequestError',
  500: 'InternalServerError',
  503: 'ServiceUnavailableError',
  504: 'GatewayTimeoutError',
};

/** Answers `err` as vLLM does: `{error: {message, type, param, code}}`, `code` the status. */
const failVllm: Fail = (ctx: RequestContext, err: unknown) =>
  ctx.fail(
    err,
    (info) => {
      const status = badRequestStatus(info);
      const param = info.err instanceof FieldValidationError ? info.err.param : null;
      return { error: { message: info.message, type: TYPE_OF_STATUS[status] ?? (status >= 500 ? 'InternalServerError' : 'BadRequestError'), param, code: status } };
    },
    badRequestStatus,
  );

// ------------------------------------------------------------ shared parts

/** How an input is cut: vLLM's truncate_prompt_tokens (-1 the model's length, N tokens), else --long-inputs (a reranker's pairs chunked there too). */
function truncation(ec: EndpointContext, model: ServedModel, body: { truncate_prompt_tokens?: number | null | undefined; truncation_side?: 'left' | 'right' | null | undefined }) {
  const t = body.truncate_prompt_tokens;
  if (t == null) return { ...cutOf(ec, model, {}), direction: body.truncation_side ?? undefined, maxLength: undefined };
  if (t === 0) throw new FieldValidationError('truncate_prompt_tokens must be -1 or at least 1', 'truncate_prompt_tokens');
  return { truncate: true, chunk: undefined, direction: body.truncation_side ?? undefined, maxLength: t === -1 ? undefined : Math.min(t, model.plan.maxLength) };
}

/** use_activation, or its older names (softmax, activation); default true. */
const activation = (body: { use_activation?: boolean | null; softmax?: boolean | null; activation?: boolean | null }) => body.use_activation ?? body.softmax ?? body.activation ?? true;

/** vLLM's usage: prompt tokens only (a pooling model generates none); `windows`, our extension, where an input was chunked (docs/long-inputs.md). */
const usage = (r: InferResult) => ({ prompt_tokens: r.tokens, total_tokens: r.tokens, completion_tokens: 0, prompt_tokens_details: null, ...(r.windows !== undefined ? { windows: r.windows } : {}) });

const truncateAdvice = () => 'send "truncate_prompt_tokens": -1 to cut it to the model\'s length';

/** The text of a ScoreInput: a string, or its text parts joined. */
function scoreText(x: ScoreInput, side: string, i: number): string {
  const text = typeof x === 'string' ? x : x.content.map((p) => p.text).join('');
  if (text.length === 0) throw new ValidationError(`${side}[${i}] is empty`);
  return text;
}

// ------------------------------------------------------------ /score

/** The two sides of a score request, in whichever of vLLM's names the body uses. */
function sides(body: VllmScoreRequest): { first: ScoreInput[]; second: ScoreInput[]; names: [string, string] } {
  const pairs: [string, string][] = [
    ['queries', 'documents'],
    ['queries', 'items'],
    ['text_1', 'text_2'],
    ['data_1', 'data_2'],
  ];
  const b = body as Record<string, ScoreInput | ScoreInput[] | undefined>;
  for (const [a, c] of pairs) {
    if (b[a] !== undefined && b[c] !== undefined) {
      const list = (x: ScoreInput | ScoreInput[]) => (Array.isArray(x) ? x : [x]);
      return { first: list(b[a]!), second: list(b[c]!), names: [a, c] };
    }
  }
  throw new ValidationError('give the two sides to score: "queries" and "documents" (or "text_1" and "text_2", "queries" and "items", "data_1" and "data_2")');
}

/** The model a score request runs on: the one named (a reranker or an embedding model), else the first reranker, else the first embedding model. */
function scoreModel(ec: EndpointContext, name: string | undefined): ServedModel {
  const models = ec.infer.models;
  let model: ServedModel;
  if (name !== undefined) model = models.byName(name);
  else {
    try {
      model = models.resolve('rerank');
    } catch {
      model = models.resolve('embed');
    }
  }
  ec.label.model = model.plan.spec.name;
  const task = model.plan.spec.task;
  if (task !== 'rerank' && task !== 'embed') throw new FieldValidationError(`model "${model.plan.spec.name}" is a ${task} model: /score runs a cross-encoder (rerank) or an embedding model`, 'model');
  return model;
}

interface ScoreState {
  /** Pairs scored: each the first side's text index and the second's. */
  pairs: number;
  /** Embedding model: the row of each pair's first and second text in the call's inputs (cosine); null for a cross-encoder. */
  cosine: { first: number[]; second: number[] } | null;
  raw: boolean;
}

const scoreEndpoint = (route: string): Endpoint<ScoreState> => ({
  route,
  task: null,
  parse(raw, ec) {
    const body = parseBody(VllmScoreRequest, raw);
    const { first, second, names } = sides(body);
    if (first.length === 0 || second.length === 0) throw new ValidationError(`"${first.length === 0 ? names[0] : names[1]}" must not be empty`);
    if (first.length !== 1 && first.length !== second.length) {
      throw new ValidationError(`${first.length} ${names[0]} for ${second.length} ${names[1]}: input lengths must be either 1:1, 1:N or N:N`);
    }
    const a = first.map((x, i) => scoreText(x, names[0], i));
    const b = second.map((x, i) => scoreText(x, names[1], i));
    const model = scoreModel(ec, body.model ?? undefined);
    const cut = truncation(ec, model, body);
    const scheduling = { timeoutMs: ec.timeoutMs, priority: priorityOfRank(ec, body.priority ?? undefined), cancel: ec.cancel };
    const raw_ = !activation(body);
    if (model.plan.spec.task === 'rerank') {
      if (b.length > ec.limits.maxClientBatchSize) throw new ValidationError(`${b.length} pairs exceed the limit of ${ec.limits.maxClientBatchSize} per request (--max-client-batch-size)`);
      const call: InferCall = {
        model,
        inputs: {
          kind: 'pairs',
          queries: a,
          texts: b,
          truncate: cut.truncate,
          chunk: cut.chunk,
          maxLength: cut.maxLength,
          maxQueryTokens: body.max_tokens_per_query || undefined,
          maxTextTokens: body.max_tokens_per_doc || undefined,
        },
        ...scheduling,
      };
      return { call, state: { pairs: b.length, cosine: null, raw: raw_ } };
    }
    if (body.max_tokens_per_query || body.max_tokens_per_doc) {
      throw new ValidationError('max_tokens_per_query and max_tokens_per_doc cut the sides of a cross-encoder\'s pair; with an embedding model use truncate_prompt_tokens');
    }
    const texts = [...a, ...b];
    if (texts.length > ec.limits.maxClientBatchSize) throw new ValidationError(`${texts.length} texts exceed the limit of ${ec.limits.maxClientBatchSize} per request (--max-client-batch-size)`);
    const call: InferCall = { model, inputs: { kind: 'inputs', inputs: texts, truncate: cut.truncate, chunk: cut.chunk, direction: cut.direction, maxLength: cut.maxLength }, ...scheduling };
    const cosine = { first: b.map((_, i) => (a.length === 1 ? 0 : i)), second: b.map((_, i) => a.length + i) };
    return { call, state: { pairs: b.length, cosine, raw: raw_ } };
  },
  truncateAdvice,
  answer(r, call, state) {
    let scores: number[];
    if (state.cosine) {
      const rows = embeddings(call.model, r.rows, true);
      scores = state.cosine.first.map((f, i) => dot(rows[f]!, rows[state.cosine!.second[i]!]!));
    } else {
      scores = rerankScores(r.rows, state.raw).map((s) => s.score);
    }
    return {
      id: `score-${randomUUID()}`,
      object: 'list',
      created: Math.floor(Date.now() / 1000),
      model: call.model.plan.spec.name,
      data: scores.map((score, index) => ({ index, object: 'score', score })),
      usage: usage(r),
    };
  },
});

/** The dot product in float64 (the cosine of two unit rows). */
function dot(x: Float32Array, y: Float32Array): number {
  let s = 0;
  for (let i = 0; i < x.length; i++) s += x[i]! * y[i]!;
  return s;
}

// ------------------------------------------------------------ /classify

const classifyEndpoint = (route: string): Endpoint<{ raw: boolean }> => ({
  route,
  task: 'classify',
  parse(raw, ec) {
    const body = parseBody(VllmClassifyRequest, raw);
    if (body.add_special_tokens === false) throw new FieldValidationError('add_special_tokens false is not served: a BERT classifier reads its [CLS] token', 'add_special_tokens');
    const count = inputCount(body.input);
    if (count > ec.limits.maxClientBatchSize) throw new FieldValidationError(`${count} inputs exceed the limit of ${ec.limits.maxClientBatchSize} per request (--max-client-batch-size)`, 'input');
    const model = ec.infer.models.resolve('classify', body.model ?? undefined);
    ec.label.model = model.plan.spec.name;
    const cut = truncation(ec, model, body);
    const call: InferCall = {
      model,
      inputs: { kind: 'inputs', inputs: inputList(body.input), truncate: cut.truncate, direction: cut.direction, maxLength: cut.maxLength },
      timeoutMs: ec.timeoutMs,
      priority: priorityOfRank(ec, body.priority ?? undefined),
      cancel: ec.cancel,
    };
    return { call, state: { raw: !activation(body) } };
  },
  truncateAdvice,
  answer(r, call, state) {
    const labels = call.model.plan.spec.labels;
    return {
      id: `classify-${randomUUID()}`,
      object: 'list',
      created: Math.floor(Date.now() / 1000),
      model: call.model.plan.spec.name,
      data: classifications(call.model, r.rows).map((c, index) => ({
        index,
        label: c.label,
        probs: Array.from(state.raw ? c.logits : c.probabilities),
        num_classes: labels.length,
      })),
      usage: usage(r),
    };
  },
});

const SCORE = scoreEndpoint('/score');
const SCORE_V1 = scoreEndpoint('/v1/score');
const CLASSIFY = classifyEndpoint('/classify');
const CLASSIFY_V1 = classifyEndpoint('/v1/classify');

export const vllmRoutes: Route[] = [
  { method: 'post', path: '/score', fail: failVllm, handle: (ctx, deps) => serveInference(ctx, deps, SCORE, failVllm) },
  { method: 'post', path: '/v1/score', fail: failVllm, handle: (ctx, deps) => serveInference(ctx, deps, SCORE_V1, failVllm) },
  { method: 'post', path: '/classify', fail: failVllm, handle: (ctx, deps) => serveInference(ctx, deps, CLASSIFY, failVllm) },
  { method: 'post', path: '/v1/classify', fail: failVllm, handle: (ctx, deps) => serveInference(ctx, deps, CLASSIFY_V1, failVllm) },
];
