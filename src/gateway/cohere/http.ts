/**
 * Cohere's rerank and embed APIs (and Jina's rerank, which shares its v1 route), so the clients
 * retrieval stacks use (cohere-ai's CohereClientV2 and CohereClient,
 * LangChain's CohereRerank, Jina's rerank API as Dify, GPUStack and
 * Xinference speak it) can point at slabserve:
 *
 *   POST /v2/rerank  {model, query, documents: (string | {text})[], top_n?, max_tokens_per_doc?, priority?}
 *                    -> {id, results: [{index, relevance_score}], meta: {api_version: {version: "2"}, billed_units: {search_units}}}
 *   POST /v1/rerank  {model?, query, documents, top_n?, return_documents? (true), max_tokens_per_doc?, truncate? (true), ...}
 *                    -> {id, model, results: [{index, relevance_score, document?: {text, ...}}], usage: {prompt_tokens, total_tokens},
 *                        meta: {api_version: {version: "1"}, billed_units: {search_units}}}: Cohere's v1 and Jina's answer in one
 *   POST /v2/embed   {model, texts, input_type, embedding_types? (["float"]), output_dimension?, max_tokens?, truncate? ("END"), priority?}
 *                    -> {id, embeddings: {float?, int8?, uint8?, binary?, ubinary?, base64?}, texts, meta, response_type}
 *
 * /v2/embed: `input_type` picks the model's prompt of that purpose (query,
 * document or passage, classification, clustering) where it has one; every
 * embedding type comes from one run (quantized as /embed's embedding_type).
 *
 * A relevance score is the sigmoid of the cross-encoder's logit for the (query,
 * document) pair; results are best first (ties by index), cut to `top_n` (more
 * than there are documents: all of them). A document is cut to fit the model,
 * as Cohere cuts it (`truncate: false`, our extension, refuses it instead), after
 * `max_tokens_per_doc` of its own tokens. A body's field these routes do not
 * use is ignored, as Cohere's, Jina's and vLLM's servers do.
 *
 * The transport's deadline and priority (x-deadline-ms, x-priority) apply;
 * Cohere's integer `priority` (0 the highest) picks the class of that rank
 * (0 interactive, 1 and more the next classes: bulk).
 *
 * Errors are Cohere's shape, `{id, message}` (and Jina's `detail` on /v1/rerank),
 * with our `code`; an invalid request is 400 (our 422).
 */
import { cutOf, type LongSaid } from '../long-inputs.js';
import { randomUUID } from 'node:crypto';
import { FieldValidationError, ValidationError } from '../../shared/errors.js';
import { embeddings, rerankScores } from '../../core/rows.js';
import type { InferCall, InferResult } from '../../core/infer.js';
import { prompted } from '../../core/prompts.js';
import { quantizeRow, type EmbeddingType } from '../../core/quantized-embeddings.js';
import type { ServedModel } from '../../core/served-model.js';
import { float32Base64, shorten } from '../openai/http.js';
import { badRequestStatus, type RequestContext } from '../http/request-context.js';
import type { Route } from '../http/route-types.js';
import { CohereV1RerankRequest, CohereV2EmbedRequest, CohereV2RerankRequest, parseBody, type RerankDocument, COHERE_EMBEDDING_TYPES } from '../schemas.js';
import { priorityOfRank, serveInference, type Endpoint, type EndpointContext, type Fail } from '../serving.js';

// ------------------------------------------------------------ errors in Cohere's (and Jina's) shape

/** Answers `err` as Cohere does, `{id, message}` (our `code` beside them; Jina's `detail` where `jina`). */
function cohereFail(jina: boolean): Fail {
  return (ctx: RequestContext, err: unknown) =>
    ctx.fail(err, (info) => ({ id: ctx.requestId, message: info.message, ...(jina ? { detail: info.message } : {}), code: info.code }), badRequestStatus);
}
const failCohere = cohereFail(false);
const failCohereV1 = cohereFail(true);

// ------------------------------------------------------------ shared parts

/** The text of a document (a string, or an object's `text`). */
const documentText = (d: RerankDocument) => (typeof d === 'string' ? d : d.text);

/** Cohere's search units: one per 100 documents, a chunked document's windows counting one each (as Cohere bills its chunks). */
const searchUnits = (documents: number) => Math.max(1, Math.ceil(documents / 100));

/** A reranker for `name` (the first one served when none is named), with the request's size checked. */
function rerankCall(
  ec: EndpointContext,
  name: string | undefined,
  query: string,
  docs: readonly RerankDocument[],
  opts: { said: LongSaid; maxWindows: number | null | undefined; maxTextTokens: number | undefined; priority: number | undefined },
): InferCall {
  if (docs.length > ec.limits.maxClientBatchSize) {
    throw new ValidationError(`${docs.length} documents exceed the limit of ${ec.limits.maxClientBatchSize} per request (--max-client-batch-size)`);
  }
  const model = ec.infer.models.resolve('rerank', name);
  ec.label.model = model.plan.spec.name;
  const texts = docs.map(documentText);
  texts.forEach((t, i) => {
    if (t.length === 0) throw new ValidationError(`documents[${i}] is empty`);
  });
  return {
    model,
    inputs: { kind: 'pairs', queries: [query], texts, ...cutOf(ec, model, opts.said, 'truncate', opts.maxWindows), maxTextTokens: opts.maxTextTokens },
    timeoutMs: ec.timeoutMs,
    priority: priorityOfRank(ec, opts.priority),
    cancel: ec.cancel,
  };
}

/** [{index, relevance_score}] best first (ties by index), at most `topN`. */
function ranked(r: InferResult, topN: number | undefined): { index: number; relevance_score: number }[] {
  const all = rerankScores(r.rows, false)
    .map((s) => ({ index: s.index, relevance_score: s.score }))
    .sort((a, b) => b.relevance_score - a.relevance_score || a.index - b.index);
  return topN !== undefined && topN < all.length ? all.slice(0, topN) : all;
}

// ------------------------------------------------------------ the endpoints

/** POST /v2/rerank: Cohere's Rerank v2 (CohereClientV2.rerank). */
const v2RerankEndpoint: Endpoint<{ topN: number | undefined; documents: number }> = {
  route: '/v2/rerank',
  task: 'rerank',
  parse(raw, ec) {
    const body = parseBody(CohereV2RerankRequest, raw);
    const said = { long: body.long_inputs ?? (body.max_chunks_per_doc != null ? 'chunk' : undefined) };
    const opts = { said, maxWindows: body.max_chunks_per_doc, maxTextTokens: body.max_tokens_per_doc ?? undefined, priority: body.priority ?? undefined };
    const call = rerankCall(ec, body.model, body.query, body.documents, opts);
    return { call, state: { topN: body.top_n ?? undefined, documents: body.documents.length } };
  },
  answer(r, _call, state) {
    return { id: randomUUID(), results: ranked(r, state.topN), meta: { api_version: { version: '2' }, billed_units: { search_units: searchUnits(r.windows ?? state.documents) } } };
  },
};

/** POST /v1/rerank: Cohere's Rerank v1 (CohereClient.rerank, LangChain's CohereRerank) and Jina's rerank API, one answer both read. */
const v1RerankEndpoint: Endpoint<{ topN: number | undefined; documents: readonly RerankDocument[] | null }> = {
  route: '/v1/rerank',
  task: 'rerank',
  parse(raw, ec) {
    const body = parseBody(CohereV1RerankRequest, raw);
    const fields = body.rank_fields;
    if (fields != null && !(fields.length === 1 && fields[0] === 'text')) {
      throw new ValidationError(`rank_fields ${JSON.stringify(fields)}: only a document's "text" is ranked here`);
    }
    const query = typeof body.query === 'string' ? body.query : body.query.text;
    const said = { long: body.long_inputs ?? (body.max_chunks_per_doc != null ? 'chunk' : undefined), truncate: body.truncate };
    const opts = { said, maxWindows: body.max_chunks_per_doc, maxTextTokens: body.max_tokens_per_doc ?? undefined, priority: body.priority ?? undefined };
    const call = rerankCall(ec, body.model ?? undefined, query, body.documents, opts);
    return { call, state: { topN: body.top_n ?? undefined, documents: body.return_documents === false ? null : body.documents } };
  },
  truncateAdvice: () => 'send "truncate": true (the default) to cut it',
  answer(r, call, state) {
    const results = ranked(r, state.topN);
    const docs = state.documents;
    const count = r.rows.rows.length / r.rows.width;
    return {
      id: randomUUID(),
      model: call.model.plan.spec.name,
      results: docs ? results.map((x) => ({ ...x, document: documentObject(docs[x.index]!) })) : results,
      usage: { prompt_tokens: r.tokens, total_tokens: r.tokens },
      meta: { api_version: { version: '1' }, billed_units: { search_units: searchUnits(r.windows ?? count) } },
    };
  },
};

/** A document as the answer echoes it: `{text}` for a string, an object as sent (Cohere keeps its other fields). */
function documentObject(d: RerankDocument): Record<string, unknown> {
  return typeof d === 'string' ? { text: d } : d;
}

/** The prompt names each `input_type` takes, in order, where the model has one (sentence-transformers' prompts). */
const PROMPTS_OF_INPUT_TYPE: Record<string, readonly string[]> = {
  search_query: ['query'],
  search_document: ['document', 'passage'],
  classification: ['classification'],
  clustering: ['clustering'],
};

/** The model's prompt for `inputType` (its name), or undefined: none matches, the model's default prompt applies. */
export function promptForInputType(model: ServedModel, inputType: string): string | undefined {
  return PROMPTS_OF_INPUT_TYPE[inputType]?.find((name) => model.plan.spec.prompts[name] !== undefined);
}

type CohereEmbeddingType = (typeof COHERE_EMBEDDING_TYPES)[number];

/**
 * POST /v2/embed: Cohere's Embed v2 (CohereClientV2.embed), texts only. Every
 * embedding type asked for comes from one run of the texts.
 */
const v2EmbedEndpoint: Endpoint<{ types: readonly CohereEmbeddingType[]; dimension: number | undefined; texts: string[] }> = {
  route: '/v2/embed',
  task: 'embed',
  parse(raw, ec) {
    const body = parseBody(CohereV2EmbedRequest, raw);
    if (body.texts.length > ec.limits.maxClientBatchSize) {
      throw new FieldValidationError(`${body.texts.length} texts exceed the limit of ${ec.limits.maxClientBatchSize} per request (--max-client-batch-size)`, 'texts');
    }
    const model = ec.infer.models.resolve('embed', body.model);
    const spec = model.plan.spec;
    ec.label.model = spec.name;
    const dimension = body.output_dimension ?? undefined;
    if (dimension !== undefined && dimension > spec.dimension) throw new FieldValidationError(`output_dimension ${dimension} exceeds model "${spec.name}"'s ${spec.dimension}`, 'output_dimension');
    const truncate = body.truncate ?? 'END';
    const explicit = body.truncate != null || body.max_tokens != null;
    const inputs = {
      kind: 'inputs' as const,
      inputs: body.texts,
      ...cutOf(ec, model, { long: body.long_inputs, truncate: explicit ? truncate !== 'NONE' : undefined }, 'truncate'),
      direction: truncate === 'START' ? ('left' as const) : ('right' as const),
      maxLength: body.max_tokens == null ? undefined : Math.min(body.max_tokens, model.plan.maxLength),
    };
    const promptName = promptForInputType(model, body.input_type);
    const call = prompted({ model, inputs, timeoutMs: ec.timeoutMs, priority: priorityOfRank(ec, body.priority ?? undefined), cancel: ec.cancel }, { prompt_name: promptName });
    const types: CohereEmbeddingType[] = [...new Set(body.embedding_types ?? (['float'] as const))];
    return { call, state: { types, dimension, texts: body.texts } };
  },
  truncateAdvice: () => 'send "truncate": "END" (the default) or "START" to cut it',
  answer(r, call, state) {
    const rows = embeddings(call.model, r.rows).map((v) => (state.dimension !== undefined ? shorten(v, state.dimension) : v));
    const out: Partial<Record<CohereEmbeddingType, unknown[]>> = {};
    for (const type of state.types) {
      if (type === 'float') out.float = rows.map((v) => Array.from(v));
      else if (type === 'base64') out.base64 = rows.map(float32Base64);
      else out[type] = rows.map((v) => Array.from(quantizeRow(v, type as Exclude<EmbeddingType, 'float'>)));
    }
    return {
      id: randomUUID(),
      embeddings: out,
      texts: state.texts,
      meta: { api_version: { version: '2' }, billed_units: { input_tokens: r.tokens } },
      response_type: 'embeddings_by_type',
    };
  },
};

export const cohereRoutes: Route[] = [
  { method: 'post', path: '/v2/embed', fail: failCohere, handle: (ctx, deps) => serveInference(ctx, deps, v2EmbedEndpoint, failCohere) },
  { method: 'post', path: '/v2/rerank', fail: failCohere, handle: (ctx, deps) => serveInference(ctx, deps, v2RerankEndpoint, failCohere) },
  { method: 'post', path: '/v1/rerank', fail: failCohereV1, handle: (ctx, deps) => serveInference(ctx, deps, v1RerankEndpoint, failCohereV1) },
];
