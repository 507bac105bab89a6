/**
 * text-embeddings-inference's gRPC API (proto/tei.proto, package tei.v1) over
 * the same endpoints as its HTTP routes (../tei.ts): a message becomes the
 * route's JSON body, and the answer the reply message. TEI serves one model;
 * here `x-model` metadata names one (default: the first of the call's task).
 * As TEI's gRPC: `truncate` and `normalize` are the message's booleans
 * (`truncate` false means the server's --truncate default), `normalize`
 * absent means the model's own setting, and a model of another task answers
 * FAILED_PRECONDITION (status.ts).
 *
 * EmbedSparse is /embed_sparse and EmbedAll /embed_all (a model without that
 * output: FAILED_PRECONDITION, as their 424).
 */
import { type InferResult } from '../../core/infer.js';
import { classifications, embeddings, tokenVectors } from '../../core/rows.js';
import { type ServedModel } from '../../core/served-model.js';
import { ValidationError } from '../../shared/errors.js';
import type { Task } from '../../shared/model-format/model-config.js';
import { shorten } from '../openai/http.js';
import type { Endpoint } from '../serving.js';
import { sparseEntries } from '../../core/sparse.js';
import { decodeEndpoint, embedAllEndpoint, embedEndpoint, embedSparseEndpoint, sparseRowsOf, labelScores, predictEndpoint, rerankEndpoint, tokenizeEndpoint } from './endpoints.js';
import {
  gatheredInference,
  localEndpoint,
  metadataText,
  streamInference,
  streamLocal,
  unaryInference,
  unaryLocal,
  type CallScope,
  type GrpcDeps,
  type InferenceMethod,
} from '../grpc/calls.js';

/** TEI's enum (a name with proto-loader's `enums: String`, or its number) as our field. */
function direction(v: unknown): 'right' | 'left' | undefined {
  if (v === 'TRUNCATION_DIRECTION_LEFT' || v === 1) return 'left';
  if (v === 'TRUNCATION_DIRECTION_RIGHT' || v === 0) return 'right';
  return undefined;
}

/** The fields every TEI message shares, as the HTTP body's (absent where the message leaves them unset). */
export function common(req: { truncate?: boolean }, scope: CallScope) {
  const model = metadataText(scope.metadata, 'x-model');
  return { ...(req.truncate === true ? { truncate: true } : {}), ...(model !== undefined ? { model } : {}) };
}

/** TEI's truncation_direction, where the HTTP body takes one (/embed, /predict; the pair inputs have none). */
export function directionField(req: { truncation_direction?: unknown }) {
  const d = direction(req.truncation_direction);
  return d === 'left' ? { truncation_direction: d } : {};
}

/** TEI's Metadata: where the call's time went, in ns. */
export function timings(r: InferResult, chars: number, started: number) {
  const ns = (ms: number) => Math.round(ms * 1e6);
  return {
    compute_chars: chars,
    compute_tokens: r.tokens,
    total_time_ns: ns(performance.now() - started),
    tokenization_time_ns: ns(r.tokenizeMs),
    queue_time_ns: ns(r.timing.queueMs),
    inference_time_ns: ns(r.timing.inferenceMs),
  };
}

interface EmbedMessage {
  inputs: string;
  truncate?: boolean;
  normalize?: boolean;
  truncation_direction?: unknown;
  prompt_name?: string;
  dimensions?: number;
}

type EmbedState = { normalize: boolean | undefined; dimensions: number | undefined; chars: number; started: number };

/** Embed: /embed's parse, one row as `embeddings` (the first `dimensions` of it, renormalised when normalised). */
const embed: InferenceMethod<EmbedMessage, EmbedState> = {
  endpoint: {
    route: '/tei.v1.Embed/Embed',
    task: 'embed',
    parse(raw, ec) {
      const { dimensions, ...body } = raw as EmbedMessage & { model?: string };
      const { call, state } = embedEndpoint.parse(body, ec);
      const dim = call.model.plan.spec.dimension;
      if (dimensions !== undefined && (dimensions < 1 || dimensions > dim)) throw new ValidationError(`dimensions ${dimensions}: model "${call.model.plan.spec.name}" gives 1 to ${dim}`);
      return { call, state: { normalize: state.normalize, dimensions, chars: body.inputs.length, started: performance.now() } };
    },
    answer(r, call, s) {
      let row = embeddings(call.model, r.rows, s.normalize)[0]!;
      if (s.dimensions !== undefined) row = s.normalize === false ? row.slice(0, s.dimensions) : shorten(row, s.dimensions);
      return { embeddings: Array.from(row), metadata: timings(r, s.chars, s.started) };
    },
  },
  body: (req, scope) => ({
    inputs: req.inputs,
    ...common(req, scope),
    ...directionField(req),
    ...(req.normalize !== undefined ? { normalize: req.normalize } : {}),
    ...(req.prompt_name !== undefined ? { prompt_name: req.prompt_name } : {}),
    ...(req.dimensions !== undefined ? { dimensions: req.dimensions } : {}),
  }),
};

/** EmbedSparseRequest and EmbedAllRequest: the same fields. */
interface SparseMessage {
  inputs: string;
  truncate?: boolean;
  truncation_direction?: unknown;
  prompt_name?: string;
}

function sparseBody(req: SparseMessage, scope: CallScope) {
  return {
    inputs: req.inputs,
    ...common(req, scope),
    ...directionField(req),
    ...(req.prompt_name !== undefined ? { prompt_name: req.prompt_name } : {}),
  };
}

/** EmbedSparse: /embed_sparse's parse, the one input's non-zero weights as `sparse_embeddings`. */
const embedSparse: InferenceMethod<SparseMessage, { chars: number; started: number }> = {
  endpoint: {
    route: '/tei.v1.Embed/EmbedSparse',
    task: 'embed',
    parse(raw, ec) {
      const { call } = embedSparseEndpoint.parse(raw, ec);
      return { call, state: { chars: (raw as SparseMessage).inputs.length, started: performance.now() } };
    },
    answer(r, call, s) {
      return { sparse_embeddings: sparseEntries(sparseRowsOf(r, call.model)[0]!), metadata: timings(r, s.chars, s.started) };
    },
  },
  body: sparseBody,
};

/** EmbedAll: /embed_all's parse, the one input's token vectors as `token_embeddings`; `x-input-type` metadata is a ColBERT model's input_type. */
const embedAll: InferenceMethod<SparseMessage, { chars: number; started: number }> = {
  endpoint: {
    route: '/tei.v1.Embed/EmbedAll',
    task: 'embed',
    parse(raw, ec) {
      const { call } = embedAllEndpoint.parse(raw, ec);
      return { call, state: { chars: (raw as SparseMessage).inputs.length, started: performance.now() } };
    },
    answer(r, _call, s) {
      const token_embeddings = tokenVectors(r.rows, 0).map((v) => ({ embeddings: Array.from(v) }));
      return { token_embeddings, metadata: timings(r, s.chars, s.started) };
    },
  },
  body: (req, scope) => {
    const inputType = metadataText(scope.metadata, 'x-input-type');
    return { ...sparseBody(req, scope), ...(inputType !== undefined ? { input_type: inputType } : {}) };
  },
};

interface PredictMessage {
  inputs: string | string[];
  truncate?: boolean;
  raw_scores?: boolean;
  truncation_direction?: unknown;
}

type PredictState = { kind: 'probabilities' | 'logits'; chars: number; started: number };

/** The predictions of the one input of a classifier's answer, best first. */
function predictions(model: ServedModel, r: InferResult, s: PredictState) {
  return { predictions: labelScores(model, classifications(model, r.rows)[0]!, s.kind), metadata: timings(r, s.chars, s.started) };
}

/** Predict: /predict's parse on one text. */
const predict: InferenceMethod<PredictMessage, PredictState> = {
  endpoint: {
    route: '/tei.v1.Predict/Predict',
    task: 'classify',
    parse(raw, ec) {
      const body = raw as { inputs: string; raw_scores?: boolean };
      const { call } = predictEndpoint.parse(body, ec);
      return { call, state: { kind: body.raw_scores ? 'logits' : 'probabilities', chars: body.inputs.length, started: performance.now() } };
    },
    answer: (r, call, s) => predictions(call.model, r, s),
  },
  body: (req, scope) => ({ inputs: req.inputs, ...common(req, scope), ...directionField(req), ...(req.raw_scores ? { raw_scores: true } : {}) }),
};

/** PredictPair: a classifier on a sentence pair (two texts, tokenized as a pair). */
const predictPair: InferenceMethod<PredictMessage, PredictState> = {
  endpoint: {
    route: '/tei.v1.Predict/PredictPair',
    task: 'classify',
    parse(raw, ec) {
      const body = raw as { inputs: string[]; truncate?: boolean; raw_scores?: boolean; model?: string };
      if (!Array.isArray(body.inputs) || body.inputs.length !== 2) throw new ValidationError(`PredictPair takes two inputs (a pair), got ${Array.isArray(body.inputs) ? body.inputs.length : 0}`);
      const model = ec.infer.models.resolve('classify', body.model);
      ec.label.model = model.plan.spec.name;
      const [a, b] = body.inputs as [string, string];
      const call = {
        model,
        inputs: { kind: 'pairs' as const, queries: [a], texts: [b], truncate: body.truncate ?? ec.limits.truncate },
        timeoutMs: ec.timeoutMs,
        priority: ec.priority === undefined ? undefined : ec.infer.priorityIndex(ec.priority),
        cancel: ec.cancel,
      };
      return { call, state: { kind: body.raw_scores ? 'logits' : 'probabilities', chars: a.length + b.length, started: performance.now() } };
    },
    answer: (r, call, s) => predictions(call.model, r, s),
  },
  body: (req, scope) => ({ inputs: req.inputs, ...common(req, scope), ...(req.raw_scores ? { raw_scores: true } : {}) }),
};

interface RerankMessage {
  query: string;
  texts: string[];
  truncate?: boolean;
  raw_scores?: boolean;
  return_text?: boolean;
  truncation_direction?: unknown;
}

type RerankState = { texts: string[]; returnText: boolean; raw: boolean; chars: number; started: number };

/** Rerank's endpoint: /rerank's parse; ranks best first. `pairs` (RerankStream) gives each text its own query. */
const rerankEp: Endpoint<RerankState> = {
  route: '/tei.v1.Rerank/Rerank',
  task: 'rerank',
  parse(raw, ec) {
    const body = raw as { query: string; queries?: string[]; texts: string[] };
    const { queries, ...teiBody } = body;
    const { call, state } = rerankEndpoint.parse(teiBody, ec);
    const inputs = queries ? { ...call.inputs, queries } : call.inputs;
    const chars = (queries ?? [body.query]).reduce((n, q) => n + q.length, 0) + body.texts.reduce((n, t) => n + t.length, 0);
    return { call: { ...call, inputs }, state: { ...state, chars, started: performance.now() } };
  },
  answer(r, call, s, ec) {
    const ranks = (rerankEndpoint.answer(r, call, s, ec) as { index: number; score: number; text?: string }[]).map((x) => ({ index: x.index, score: x.score, ...(x.text !== undefined ? { text: x.text } : {}) }));
    return { ranks, metadata: timings(r, s.chars, s.started) };
  },
};

const rerank: InferenceMethod<RerankMessage, RerankState> = {
  endpoint: rerankEp,
  body: (req, scope) => ({
    query: req.query,
    texts: req.texts ?? [],
    ...common(req, scope),
    ...(req.raw_scores ? { raw_scores: true } : {}),
    ...(req.return_text ? { return_text: true } : {}),
  }),
};

interface RerankStreamMessage {
  query: string;
  text: string;
  truncate?: boolean;
  raw_scores?: boolean;
  return_text?: boolean;
}

/** RerankStream: one (query, text) per message, ranked together; raw_scores and return_text from the first. */
function rerankStreamBody(reqs: RerankStreamMessage[], scope: CallScope): unknown {
  const first = reqs[0];
  return {
    query: first?.query ?? '',
    queries: reqs.map((r) => r.query),
    texts: reqs.map((r) => r.text),
    ...(first ? common(first, scope) : {}),
    ...(first?.raw_scores ? { raw_scores: true } : {}),
    ...(first?.return_text ? { return_text: true } : {}),
  };
}

interface EncodeMessage {
  inputs: string;
  add_special_tokens?: boolean;
  prompt_name?: string;
}

const tokenize = localEndpoint<EncodeMessage>(
  tokenizeEndpoint,
  (req, scope) => ({ inputs: req.inputs, add_special_tokens: req.add_special_tokens === true, model: metadataText(scope.metadata, 'x-model') }),
  (payload) => ({
    tokens: (payload as { id: number; text: string; special: boolean; start: number | null; stop: number | null }[][])[0]!.map((t) => ({
      id: t.id,
      text: t.text,
      special: t.special,
      ...(t.start !== null ? { start: t.start } : {}),
      ...(t.stop !== null ? { stop: t.stop } : {}),
    })),
  }),
);

const decode = localEndpoint<{ ids?: number[]; skip_special_tokens?: boolean }>(
  decodeEndpoint,
  (req, scope) => ({ ids: req.ids ?? [], skip_special_tokens: req.skip_special_tokens === true, model: metadataText(scope.metadata, 'x-model') }),
  (payload) => ({ text: payload as string }),
);

const MODEL_TYPES: Record<Task, string> = { embed: 'MODEL_TYPE_EMBEDDING', classify: 'MODEL_TYPE_CLASSIFIER', rerank: 'MODEL_TYPE_RERANKER' };

/** Info: the model `x-model` names (default: the first served), as TEI describes its one model. */
function info(deps: GrpcDeps, version: string, tokenizationWorkers: number) {
  return (_req: unknown, scope: CallScope) => {
    const model = deps.infer.models.anyModel(metadataText(scope.metadata, 'x-model'));
    const { spec, maxLength, batching } = model.plan;
    return {
      version,
      model_id: spec.name,
      model_dtype: spec.dtype,
      model_type: MODEL_TYPES[spec.task],
      max_concurrent_requests: deps.gate.opts.maxConnections,
      max_input_length: maxLength,
      max_batch_tokens: batching.maxBatchTokens,
      max_batch_requests: batching.maxBatchSize,
      max_client_batch_size: deps.limits.maxClientBatchSize,
      tokenization_workers: tokenizationWorkers,
    };
  };
}

/** The services of tei.v1, by service name, each a handler per method. */
export function teiServices(deps: GrpcDeps, version: string, tokenizationWorkers: number) {
  return {
    Info: { Info: unaryLocal(deps, '/tei.v1.Info/Info', info(deps, version, tokenizationWorkers)) },
    Embed: {
      Embed: unaryInference(deps, '/tei.v1.Embed/Embed', embed),
      EmbedStream: streamInference(deps, '/tei.v1.Embed/EmbedStream', embed),
      EmbedSparse: unaryInference(deps, '/tei.v1.Embed/EmbedSparse', embedSparse),
      EmbedSparseStream: streamInference(deps, '/tei.v1.Embed/EmbedSparseStream', embedSparse),
      EmbedAll: unaryInference(deps, '/tei.v1.Embed/EmbedAll', embedAll),
      EmbedAllStream: streamInference(deps, '/tei.v1.Embed/EmbedAllStream', embedAll),
    },
    Predict: {
      Predict: unaryInference(deps, '/tei.v1.Predict/Predict', predict),
      PredictPair: unaryInference(deps, '/tei.v1.Predict/PredictPair', predictPair),
      PredictStream: streamInference(deps, '/tei.v1.Predict/PredictStream', predict),
      PredictPairStream: streamInference(deps, '/tei.v1.Predict/PredictPairStream', predictPair),
    },
    Rerank: {
      Rerank: unaryInference(deps, '/tei.v1.Rerank/Rerank', rerank),
      RerankStream: gatheredInference<RerankStreamMessage, RerankState>(deps, '/tei.v1.Rerank/RerankStream', () => deps.limits.maxClientBatchSize, { endpoint: rerankEp, body: rerankStreamBody }),
    },
    Tokenize: {
      Tokenize: unaryLocal(deps, '/tei.v1.Tokenize/Tokenize', tokenize),
      TokenizeStream: streamLocal(deps, '/tei.v1.Tokenize/TokenizeStream', tokenize),
      Decode: unaryLocal(deps, '/tei.v1.Tokenize/Decode', decode),
      DecodeStream: streamLocal(deps, '/tei.v1.Tokenize/DecodeStream', decode),
    },
  };
}
