/**
 * text-embeddings-inference's API as endpoints of the serving skeleton
 * (serving.ts): /embed, /predict, /rerank and /similarity run the model;
 * /tokenize and /decode do not. The HTTP routes (routes.ts, src/gateway/tei/http.ts) and the
 * WebSocket ops (src/gateway/ws/api.ts) serve these same endpoints, so `/embed` over HTTP
 * and `{op: "embed"}` over /ws answer the same thing.
 */
import { FieldValidationError, OutputUnavailableError, ValidationError } from '../../shared/errors.js';
import type { ModelOutput, Pooling, Task } from '../../shared/model-format/model-config.js';
import { floatAnswer, quantizedRowsAnswer, rowLists, rowsAnswer } from '../http/answers.js';
import { float32RowListsJsonView, float32RowsInJson, outputsJson, sparseRowsJson, type OutputsItem } from '../http/float-json.js';
import { keptTokens } from '../../core/colbert.js';
import type { ColbertInputType } from '../../core/inputs.js';
import { sparseEntries, sparseOf, type SparseRow } from '../../core/sparse.js';
import { m3Colbert, m3Sparse } from '../../core/m3.js';
import { type InferResult } from '../../core/infer.js';
import { inputCount, inputList, isSingleInput, type Inputs } from '../../core/inputs.js';
import { classifications, embeddings, rerankScores, tokenVectors, type Classification } from '../../core/rows.js';
import { type ServedModel } from '../../core/served-model.js';
import {
  DecodeRequest,
  EmbedAllRequest,
  EmbedRequest,
  EmbedSparseRequest,
  parseBody,
  type EmbedOutput,
  PredictRequest,
  quickEmbedRequest,
  quickPredictRequest,
  RerankRequest,
  SimilarityRequest,
  TokenizeRequest,
} from '../schemas.js';
import { prompted, requestPrompt } from '../../core/prompts.js';
import { checkChunks, chunkTokens, codePoints, holdsToken, normalizeInPlace, poolChunk, runTokenStarts, textTokenStarts } from '../../core/late-chunking.js';
import type { RequestRows } from '../../core/submitter.js';
import { quantizeRow, scalesTheUnitRow, type EmbeddingType } from '../../core/quantized-embeddings.js';
import { similaritiesToFirst } from '../../core/similarity.js';
import type { Endpoint, EndpointContext, LocalEndpoint } from '../serving.js';
import { cutOf } from '../long-inputs.js';
import { tryChunked } from '../../core/long-inputs.js';
import type { LongInputs } from '../../shared/options.js';

/** What a route runs on: a task's models, any model (null), or embedding models that give an output. */
type Wanted = Task | null | { output: ModelOutput; route: string };

/** Checks the request's size and picks its model: the path's and the body's names must agree. */
function pickModel(ec: EndpointContext, want: Wanted, count: number, bodyModel: string | undefined): ServedModel {
  if (ec.pathModel !== undefined && bodyModel !== undefined && bodyModel !== ec.pathModel) {
    throw new ValidationError(`the path names model "${ec.pathModel}" but the body names "${bodyModel}"`);
  }
  if (count > ec.limits.maxClientBatchSize) {
    throw new ValidationError(`${count} inputs exceed the limit of ${ec.limits.maxClientBatchSize} per request (--max-client-batch-size)`);
  }
  const name = ec.pathModel ?? bodyModel;
  const model =
    want === null ? ec.infer.models.anyModel(name) : typeof want === 'string' ? ec.infer.models.resolve(want, name) : ec.infer.models.resolveOutput(want.output, want.route, name);
  ec.label.model = model.plan.spec.name;
  return model;
}

/** The call's deadline and priority: the body's `timeout` / `priority` win over the transport's. */
function scheduling(ec: EndpointContext, body: { timeout?: number | undefined; priority?: string | undefined }) {
  const priority = body.priority ?? ec.priority;
  return { timeoutMs: body.timeout ?? ec.timeoutMs, priority: priority === undefined ? undefined : ec.infer.priorityIndex(priority), cancel: ec.cancel };
}

function inputsCall(
  ec: EndpointContext,
  want: Wanted,
  body: { inputs: Inputs; truncate?: boolean | undefined; truncation_direction?: 'right' | 'left' | undefined; long_inputs?: LongInputs | undefined; model?: string | undefined; timeout?: number; priority?: string },
) {
  const model = pickModel(ec, want, inputCount(body.inputs), body.model);
  const cut = cutOf(ec, model, { long: body.long_inputs, truncate: body.truncate });
  const inputs = { kind: 'inputs' as const, inputs: inputList(body.inputs), ...cut, direction: body.truncation_direction };
  return { model, inputs, ...scheduling(ec, body) };
}

/**
 * int8 and uint8 scale the L2-normalised row (core/quantized-embeddings.ts), so they cannot
 * honour `normalize: false`: refused rather than ignored. Binary types read
 * signs, which the norm does not change.
 */
export function checkEmbeddingType(type: EmbeddingType | undefined, normalize: boolean | undefined): EmbeddingType {
  const t = type ?? 'float';
  if (t !== 'float' && normalize === false && scalesTheUnitRow(t)) {
    throw new FieldValidationError(`embedding_type "${t}" quantizes the L2-normalised row; it cannot be combined with normalize: false`, 'normalize');
  }
  return t;
}

/**
 * POST /embed `{inputs, normalize?, truncate?, model?, prompt_name?, prompt?, embedding_type?, chunks?}` -> one row per input
 * (with `chunks`, one per chunk of the one text: {@link lateChunked}):
 * numbers (f32 bytes over WebSocket when asked), or quantized (integer lists; bytes in msgpack and WebSocket frames).
 */
export const embedEndpoint: Endpoint<{ normalize: boolean | undefined; type: EmbeddingType; outputs: readonly EmbedOutput[] | null; chunks?: ChunkPlan }> = {
  route: '/embed',
  task: 'embed',
  parse(raw, ec) {
    const body = quickEmbedRequest(raw) ?? parseBody(EmbedRequest, raw);
    const type = checkEmbeddingType(body.embedding_type, body.normalize);
    if (body.chunks !== undefined) {
      if (body.outputs) throw new FieldValidationError('chunks answer pooled dense rows: `outputs` cannot be combined with them', 'outputs');
      return lateChunked(ec, body, body.chunks, type);
    }
    const call = prompted(inputsCall(ec, 'embed', body), body);
    if (call.model.plan.spec.pooling === 'splade') checkSpladeRows(call.model, body.normalize, type);
    const outputs = body.outputs ? checkOutputs(call.model, body.outputs, type) : null;
    // BGE-M3's sparse and colbert outputs come from its token vectors: those slots take pages of the token area.
    const tokenRows = outputs !== null && call.model.plan.spec.m3 !== undefined && outputs.some((o) => o !== 'dense');
    return { call: tokenRows ? { ...call, tokenRows } : call, state: { normalize: body.normalize, type, outputs } };
  },
  answer(r, call, state, ec) {
    if (state.outputs) return outputsAnswer(r, call.model, state.outputs, state.normalize);
    const rows = state.chunks ? chunkRows(call.model, r.rows, state.chunks, state.normalize) : embeddings(call.model, r.rows, state.normalize);
    const type = state.type;
    if (type !== 'float') return quantizedRowsAnswer(rows.map((v) => quantizeRow(v, type)));
    return ec.f32 ? rows.map((v) => new Uint8Array(v.buffer, v.byteOffset, v.byteLength)) : rowsAnswer(rows);
  },
};

/** `outputs` the model gives (424 naming what it gives), float rows only. */
function checkOutputs(model: ServedModel, outputs: readonly EmbedOutput[], type: EmbeddingType): readonly EmbedOutput[] {
  const spec = model.plan.spec;
  const missing = outputs.filter((o) => !spec.outputs.includes(o));
  if (missing.length > 0) throw new OutputUnavailableError(`model "${spec.name}" has no ${missing.join(' or ')} output: it gives ${spec.outputs.join(' and ')}`);
  if (type !== 'float') throw new FieldValidationError(`embedding_type "${type}" applies to rows; with \`outputs\` each output is answered in float`, 'embedding_type');
  return outputs;
}

/** Per input, the outputs asked for: the dense row, the sparse weights, the colbert vectors (gRPC's slabserve.v1.Outputs too). */
export function outputItems(r: InferResult, model: ServedModel, outputs: readonly EmbedOutput[], normalize: boolean | undefined): OutputsItem[] {
  const count = r.rows.rows.length / r.rows.width;
  const dense = outputs.includes('dense') ? embeddings(model, r.rows, normalize) : null;
  const sparse = outputs.includes('sparse') ? sparseRowsOf(r, model) : null;
  const m3 = model.plan.spec.m3;
  const colbert = outputs.includes('colbert') ? Array.from({ length: count }, (_, i) => m3Colbert(r.inputIds![i]!.length, r.rows.tokens![i]!, m3!)) : null;
  return Array.from({ length: count }, (_, i) => ({
    ...(dense ? { dense: dense[i]! } : {}),
    ...(sparse ? { sparse: sparse[i]! } : {}),
    ...(colbert ? { colbert: colbert[i]! } : {}),
  }));
}

/** Per input `{dense?, sparse?, colbert?}`, in /embed's, /embed_sparse's and /embed_all's forms. */
function outputsAnswer(r: InferResult, model: ServedModel, outputs: readonly EmbedOutput[], normalize: boolean | undefined) {
  const items = outputItems(r, model, outputs, normalize);
  const value = () =>
    items.map((x) => ({
      ...(x.dense ? { dense: Array.from(x.dense) } : {}),
      ...(x.sparse ? { sparse: sparseEntries(x.sparse) } : {}),
      ...(x.colbert ? { colbert: rowLists(x.colbert) } : {}),
    }));
  return floatAnswer(value, () => outputsJson(items));
}

/**
 * Each input's sparse weights: a SPLADE model's pooled row (its non-zeros), or
 * BGE-M3's per-token weights (its token vectors and ids: core/m3.ts).
 */
export function sparseRowsOf(r: InferResult, model: ServedModel): SparseRow[] {
  const m3 = model.plan.spec.m3;
  if (!m3) return embeddings(model, r.rows, false).map(sparseOf);
  return r.inputIds!.map((ids, i) => m3Sparse(ids, r.rows.tokens![i]!, m3));
}

/** What a late-chunked /embed answer needs: each chunk's token indices in the run, how many tokens ran, the model's pooling. */
interface ChunkPlan {
  tokens: Int32Array[];
  ran: number;
  pooling: Pooling;
}

/**
 * /embed with `chunks`: late chunking (core/late-chunking.ts has the rules).
 * The one text (its prompt before it) runs whole as one input whose token
 * states come back (tokenRows); answer() pools each chunk from them. Chunks
 * never change which model answers: the one /embed picks, 424 when it has no
 * token states (SPLADE, or its token area is off).
 *
 * The text is tokenized here rather than by Infer, because the offsets must
 * be those of the tokens that ran: encode() exactly as Infer would (the
 * model's max length, the request's truncation, its 413; chunked, the whole
 * text up to --max-input-tokens, run as windows and their states joined)
 * gives the tokens the call runs, and tokenize() of the same text gives their offsets,
 * matched id by id (runTokenStarts), truncation included. Both run on the
 * event loop, so the text is bounded as /tokenize's texts are.
 */
function lateChunked(ec: EndpointContext, body: EmbedRequest, raw: readonly unknown[], type: EmbeddingType) {
  const text = chunkedText(body.inputs);
  const model = pickModel(ec, 'embed', 1, body.model);
  const spec = model.plan.spec;
  if (!spec.outputs.includes('tokens') || spec.pooling === 'splade') {
    throw new OutputUnavailableError(`model "${spec.name}" has no token states to pool chunks from: it gives ${spec.outputs.join(' and ')}`);
  }
  const tok = model.tokenizer;
  if (!tok.tokenize) throw new ValidationError(`model "${spec.name}"'s tokenizer cannot report token offsets, which chunks need`);
  const chunks = checkChunks(raw, codePoints(text), ec.limits.maxClientBatchSize);
  const prompt = requestPrompt(model, body);
  if (prompt.length + text.length > MAX_TOKENIZE_CHARS) {
    throw new ValidationError(`${prompt.length + text.length} characters with chunks; at most ${MAX_TOKENIZE_CHARS} (their offsets are computed on the gateway's event loop)`);
  }
  const direction = body.truncation_direction;
  // Chunked, the text runs as windows whose token states are joined (core/window-rows.ts): its tokens are all of it.
  const cut = cutOf(ec, model, { long: body.long_inputs, truncate: body.truncate });
  const encode = () => tok.encode(prompt + text, { maxLength: cut.chunk?.maxInputTokens ?? model.plan.maxLength, truncate: cut.truncate, direction });
  const encoded = cut.chunk ? tryChunked(encode, cut.chunk) : encode();
  const spans = tok.tokenize(prompt + text, true);
  const shift = codePoints(prompt);
  const whole = textTokenStarts(spans, shift);
  const tokens = chunkTokens(chunks, runTokenStarts(encoded.ids, spans, direction, shift), (c) => holdsToken(c, whole));
  const inputs = { kind: 'tokens' as const, tokens: [{ ids: encoded.ids, typeIds: encoded.typeIds }], chunk: cut.chunk };
  const plan: ChunkPlan = { tokens, ran: encoded.ids.length, pooling: spec.pooling };
  return { call: { model, inputs, ...scheduling(ec, body), tokenRows: true }, state: { normalize: body.normalize, type, outputs: null, chunks: plan } };
}

/** The one text a request with chunks embeds: a string, or a list holding one. */
function chunkedText(inputs: Inputs): string {
  const list = inputList(inputs);
  if (list.length !== 1) throw new FieldValidationError(`chunks are spans of one text: give one input, not ${list.length}`, 'chunks');
  const text = list[0];
  if (typeof text !== 'string') throw new FieldValidationError('chunks are spans of a text: token ids have no character offsets', 'chunks');
  if (text.length === 0) throw new ValidationError('inputs must not be empty strings');
  return text;
}

/** A late-chunked answer's rows: each chunk pooled from the text's token states, normalised as the model's rows are. */
function chunkRows(model: ServedModel, r: RequestRows, plan: ChunkPlan, normalize: boolean | undefined): Float32Array[] {
  const states = r.tokens?.[0];
  const width = r.tokenWidth ?? 0;
  if (!states || width === 0 || states.length !== plan.ran * width) throw new Error(`late chunking: expected the token states of ${plan.ran} tokens`);
  const keep = normalize ?? model.plan.spec.normalize;
  return plan.tokens.map((rows) => {
    const row = poolChunk(states, width, rows, plan.pooling);
    return keep ? normalizeInPlace(row) : row;
  });
}

/**
 * A SPLADE model's /embed rows are its vocabulary-wide weights as they are:
 * `normalize: true` is refused as TEI refuses it, and so are the quantized
 * types, which scale a normalised row.
 */
function checkSpladeRows(model: ServedModel, normalize: boolean | undefined, type: EmbeddingType): void {
  const name = model.plan.spec.name;
  if (normalize === true) throw new OutputUnavailableError(`\`normalize\` is not available for SPLADE models ("${name}"): its rows are token weights`);
  if (type !== 'float') throw new OutputUnavailableError(`embedding_type "${type}" is not available for SPLADE models ("${name}"): only float rows`);
}

/**
 * POST /embed_sparse `{inputs, truncate?, truncation_direction?, prompt_name?, model?}` ->
 * per input its non-zero weights `[{index, value}]`, ids ascending (TEI's route).
 * A model without a sparse output (SPLADE's) is 424; with no model named, the first that has one.
 */
export const embedSparseEndpoint: Endpoint<null> = {
  route: '/embed_sparse',
  task: 'embed',
  parse(raw, ec) {
    const body = parseBody(EmbedSparseRequest, raw);
    const call = prompted(inputsCall(ec, { output: 'sparse', route: '/embed_sparse' }, body), body);
    // BGE-M3's weights come from its token vectors (core/m3.ts), SPLADE's from its pooled row.
    return { call: call.model.plan.spec.m3 ? { ...call, tokenRows: true } : call, state: null };
  },
  answer(r, call) {
    const rows = sparseRowsOf(r, call.model);
    return floatAnswer(() => rows.map(sparseEntries), () => sparseRowsJson(rows));
  },
};

/**
 * POST /embed_all `{inputs, truncate?, truncation_direction?, prompt_name?, model?, input_type?}` ->
 * per input, per token (special tokens included, padding never), its vector: the
 * token states (TEI's route). A ColBERT model's are its projected, normalised
 * vectors, marked by `input_type` (required there; core/colbert.ts). A model
 * without token vectors (SPLADE) is 424.
 */
export const embedAllEndpoint: Endpoint<ColbertInputType | null> = {
  route: '/embed_all',
  task: 'embed',
  parse(raw, ec) {
    const body = parseBody(EmbedAllRequest, raw);
    const call = prompted(inputsCall(ec, { output: 'tokens', route: '/embed_all' }, body), body);
    const kind = colbertInputType(call.model, body.input_type);
    return { call: { ...call, inputs: { ...call.inputs, colbert: kind ?? undefined }, tokenRows: true }, state: kind };
  },
  answer(r, call, kind) {
    const lists = Array.from({ length: r.rows.rows.length / r.rows.width }, (_, i) => {
      const vectors = tokenVectors(r.rows, i);
      return kind ? keptTokens(r.inputIds![i]!, call.model.plan.spec.colbert!, kind).map((t) => vectors[t]!) : vectors;
    });
    return floatAnswer(() => lists.map(rowLists), () => float32RowListsJsonView(lists));
  },
};

/** `input_type` where the model is ColBERT (required: a query and a document are marked and cut apart), refused elsewhere. */
function colbertInputType(model: ServedModel, type: ColbertInputType | undefined): ColbertInputType | null {
  const name = model.plan.spec.name;
  if (!model.plan.spec.colbert) {
    if (type !== undefined) throw new FieldValidationError(`input_type is for ColBERT models; "${name}" gives its token states as they are`, 'input_type');
    return null;
  }
  if (type === undefined) throw new FieldValidationError(`"${name}" is a ColBERT model: say "input_type": "query" or "document" (they are marked and cut to different lengths)`, 'input_type');
  return type;
}

/** Which numbers a classification answers with: softmax probabilities (the default), the logits, or their sigmoids. */
type ScoreKind = 'probabilities' | 'logits' | 'sigmoid';

/** [{label, score}] sorted by score, highest first, at most `topK` of them. */
export function labelScores(model: ServedModel, c: Classification, kind: ScoreKind, topK = Infinity): { label: string; score: number }[] {
  const values = kind === 'logits' ? c.logits : c.probabilities;
  const score = kind === 'sigmoid' ? (i: number) => 1 / (1 + Math.exp(-c.logits[i]!)) : (i: number) => values[i]!;
  const all = model.plan.spec.labels.map((label, i) => ({ label, score: score(i) })).sort((a, b) => b.score - a.score);
  return topK < all.length ? all.slice(0, topK) : all;
}

/**
 * Whether a /predict request is Hugging Face's text-classification task
 * rather than TEI's /predict: the two bodies are alike, but HF's answer to
 * one string is a list holding its list of labels (`[[{label, score}]]`,
 * what `@huggingface/inference`'s `textClassification` and `huggingface_hub`
 * read), TEI's the list itself. Told apart by what the client sends: HF's
 * `parameters` (TEI has none), or the HF clients' User-Agent.
 */
function isHuggingFaceTask(body: PredictRequest, userAgent: string | undefined): boolean {
  if (body.parameters != null) return true;
  return userAgent !== undefined && (userAgent.startsWith('@huggingface/inference') || userAgent.startsWith('huggingface_hub'));
}

/**
 * POST /predict `{inputs, raw_scores?, truncate?, model?, parameters?: {function_to_apply?, top_k?}}` ->
 * [{label, score}] (a list of those for a list of inputs, and for one input of Hugging Face's task).
 */
export const predictEndpoint: Endpoint<{ kind: ScoreKind; topK: number; single: boolean }> = {
  route: '/predict',
  task: 'classify',
  parse(raw, ec) {
    const body = quickPredictRequest(raw) ?? parseBody(PredictRequest, raw);
    const fn = body.parameters?.function_to_apply;
    const kind: ScoreKind = body.raw_scores || fn === 'none' ? 'logits' : fn === 'sigmoid' ? 'sigmoid' : 'probabilities';
    const single = isSingleInput(body.inputs) && !isHuggingFaceTask(body, ec.userAgent);
    return { call: inputsCall(ec, 'classify', body), state: { kind, topK: body.parameters?.top_k ?? Infinity, single } };
  },
  answer(r, call, state) {
    const lists = classifications(call.model, r.rows).map((c) => labelScores(call.model, c, state.kind, state.topK));
    return state.single ? lists[0] : lists;
  },
};

/**
 * POST /rerank `{query, texts, raw_scores?, return_text?, truncate?, model?}`
 * -> `[{index, score, text?}]`, highest score first. Each (query, text) pair
 * is one input of a cross-encoder (a `rerank` model).
 */
export const rerankEndpoint: Endpoint<{ texts: string[]; returnText: boolean; raw: boolean }> = {
  route: '/rerank',
  task: 'rerank',
  parse(raw, ec) {
    const body = parseBody(RerankRequest, raw);
    const model = pickModel(ec, 'rerank', body.texts.length, body.model);
    const cut = cutOf(ec, model, { long: body.long_inputs ?? (body.max_chunks_per_doc ? 'chunk' : undefined), truncate: body.truncate }, undefined, body.max_chunks_per_doc);
    const call = { model, inputs: { kind: 'pairs' as const, queries: [body.query], texts: body.texts, ...cut }, ...scheduling(ec, body) };
    return { call, state: { texts: body.texts, returnText: body.return_text ?? false, raw: body.raw_scores ?? false } };
  },
  answer(r, _call, state) {
    return rerankScores(r.rows, state.raw)
      .map((s) => (state.returnText ? { index: s.index, score: s.score, text: state.texts[s.index]! } : { index: s.index, score: s.score }))
      .sort((a, b) => b.score - a.score || a.index - b.index);
  },
};

/**
 * POST /similarity `{inputs: {source_sentence, sentences}, parameters?: {truncate?,
 * truncation_direction?, prompt_name?}, model?}` -> the cosine similarity of each
 * sentence to the source, in order (text-embeddings-inference's route, Hugging
 * Face's sentence-similarity task). The source and the sentences are one
 * request of an embedding model: one slot each, batched together.
 */
export const similarityEndpoint: Endpoint<null> = {
  route: '/similarity',
  task: 'embed',
  parse(raw, ec) {
    const body = parseBody(SimilarityRequest, raw);
    const p: Partial<NonNullable<SimilarityRequest['parameters']>> = body.parameters ?? {};
    const { source_sentence, sentences } = body.inputs;
    const inputs = [source_sentence, ...sentences];
    const call = inputsCall(ec, 'embed', { ...body, inputs, truncate: p.truncate ?? undefined, truncation_direction: p.truncation_direction });
    return { call: prompted(call, { prompt_name: p.prompt_name ?? undefined }), state: null };
  },
  truncateAdvice: () => 'send "parameters": {"truncate": true} to cut it',
  answer(r, call) {
    const scores = similaritiesToFirst(embeddings(call.model, r.rows, true));
    // JSON: each score the shortest decimal of its float32, as TEI's serde writes f32.
    return floatAnswer(() => Array.from(scores), () => float32RowsInJson(['', ''], [scores]));
  },
};

/** Which of TEI's bodies a POST / body is, by its fields (null: none of them). */
type BodyShape = 'rerank' | 'similarity' | 'inputs';
function bodyShape(raw: unknown): BodyShape | null {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return null;
  const b = raw as Record<string, unknown>;
  if (b.query !== undefined || b.texts !== undefined) return 'rerank';
  // `inputs` an object: a sentence-similarity body (an /embed or /predict body's inputs never are).
  if (typeof b.inputs === 'object' && b.inputs !== null && !Array.isArray(b.inputs)) return 'similarity';
  return b.inputs !== undefined ? 'inputs' : null;
}

const ROOT_BODIES = 'the body of /embed or /predict {"inputs"}, /rerank {"query", "texts"} or /similarity {"inputs": {"source_sentence", "sentences"}}';

/** The endpoint of each task, by body shape: what POST / answers with for a model of that task. */
const BY_TASK: Record<Task, Partial<Record<BodyShape, Endpoint<unknown>>>> = {
  embed: { inputs: embedEndpoint as Endpoint<unknown>, similarity: similarityEndpoint as Endpoint<unknown> },
  classify: { inputs: predictEndpoint as Endpoint<unknown> },
  rerank: { rerank: rerankEndpoint as Endpoint<unknown> },
};
const FIRST_SHAPE: Record<Task, BodyShape> = { embed: 'inputs', classify: 'inputs', rerank: 'rerank' };
const SHAPE_NAMES: Record<BodyShape, string> = {
  rerank: 'a /rerank body {"query", "texts"}',
  similarity: 'a /similarity body {"inputs": {"source_sentence", "sentences"}}',
  inputs: 'an /embed or /predict body {"inputs"}',
};

/** The endpoint for a body sent to model `model`: its task's, refused when the body is another task's. */
function endpointFor(model: ServedModel, shape: BodyShape | null): Endpoint<unknown> {
  const { task, name } = model.plan.spec;
  const ep = BY_TASK[task][shape ?? FIRST_SHAPE[task]];
  if (!ep) {
    const takes = Object.values(BY_TASK[task]).map((e) => e.route).join(' or ');
    throw new ValidationError(`model "${name}" (task ${task}) takes the body of ${takes}, not ${SHAPE_NAMES[shape!]}: "model" picks the task`);
  }
  return ep;
}

/** The model a POST / body names none for: the first served that its shape can run on. */
function firstModelFor(ec: EndpointContext, shape: BodyShape | null): ServedModel {
  if (shape === null) throw new ValidationError(`POST / takes ${ROOT_BODIES}; "model" picks the task`);
  if (shape === 'rerank') return ec.infer.models.resolve('rerank');
  if (shape === 'similarity') return ec.infer.models.resolve('embed');
  const first = ec.infer.models.list().find((m) => m.plan.spec.task !== 'rerank');
  if (!first) throw new ValidationError(`no embedding or classification model is served for an {"inputs"} body; POST / takes ${ROOT_BODIES}`);
  return first;
}

/**
 * POST / as text-embeddings-inference's root route: the body of /embed,
 * /predict, /rerank or /similarity. A model named (the body's `model`, or the
 * path's) answers with its task; with none, the body's shape picks: `query`
 * and `texts` the first reranker, `inputs.source_sentence` the first
 * embedding model (as TEI's root answers with TASK=sentence-similarity, so a
 * client pointed at the server's root URL works), other `inputs` the first
 * embedding or classification model served.
 */
export const rootEndpoint: Endpoint<{ inner: Endpoint<unknown>; state: unknown }> = {
  route: '/',
  task: null,
  parse(raw, ec) {
    const named = typeof raw === 'object' && raw !== null && typeof (raw as { model?: unknown }).model === 'string' ? (raw as { model: string }).model : undefined;
    const shape = bodyShape(raw);
    const name = ec.pathModel ?? named;
    const inner = endpointFor(name !== undefined ? ec.infer.models.anyModel(name) : firstModelFor(ec, shape), shape);
    const { call, state } = inner.parse(raw, ec);
    return { call, state: { inner, state } };
  },
  truncateAdvice: (s) => s.inner.truncateAdvice?.(s.state) ?? 'send "truncate": true to cut it',
  answer(r, call, s, ec) {
    return s.inner.answer(r, call, s.state, ec);
  },
};

/** Most characters one tokenize request may hold: about 0.1 s of the gateway's event loop. */
export const MAX_TOKENIZE_CHARS = 65_536;

/**
 * POST /tokenize `{inputs, add_special_tokens?, model?}` -> per input, a list
 * of `{id, text, special, start, stop}` (offsets in code points; null for
 * the special tokens). Always a list of lists, as TEI answers.
 */
export const tokenizeEndpoint: LocalEndpoint = {
  route: '/tokenize',
  run(raw, ec) {
    const body = parseBody(TokenizeRequest, raw);
    const texts = typeof body.inputs === 'string' ? [body.inputs] : body.inputs;
    const model = pickModel(ec, null, texts.length, body.model);
    const tok = model.tokenizer;
    if (!tok.tokenize) throw new ValidationError(`model "${model.plan.spec.name}"'s tokenizer cannot report tokens`);
    const chars = texts.reduce((n, t) => n + t.length, 0);
    if (chars > MAX_TOKENIZE_CHARS) {
      throw new ValidationError(`${chars} characters to tokenize; at most ${MAX_TOKENIZE_CHARS} per request (tokens and offsets are computed on the gateway's event loop)`);
    }
    const payload = texts.map((t) => tok.tokenize!(t, body.add_special_tokens ?? true));
    return { payload, model: model.plan.spec.name, inputs: texts.length };
  },
};

/** POST /decode `{ids, skip_special_tokens?, model?}` -> a string for one list of ids, a list of strings for a list of lists. */
export const decodeEndpoint: LocalEndpoint = {
  route: '/decode',
  run(raw, ec) {
    const body = parseBody(DecodeRequest, raw);
    const single = body.ids.length === 0 || typeof body.ids[0] === 'number';
    const lists = (single ? [body.ids] : body.ids) as number[][];
    const model = pickModel(ec, null, lists.length, body.model);
    const vocab = model.tokenizer.vocabSize;
    for (const list of lists) {
      for (const id of list) if (id >= vocab) throw new ValidationError(`token id ${id} is not in [0, ${vocab})`);
    }
    const texts = lists.map((l) => model.tokenizer.decode(l, body.skip_special_tokens ?? true));
    return { payload: single ? texts[0] : texts, model: model.plan.spec.name, inputs: lists.length };
  },
};

/** The WebSocket ops that run the model, by name. */
export const TEI_ENDPOINTS: ReadonlyMap<string, Endpoint<never>> = new Map<string, Endpoint<never>>([
  ['embed', embedEndpoint as Endpoint<never>],
  ['embed_sparse', embedSparseEndpoint as Endpoint<never>],
  ['embed_all', embedAllEndpoint as Endpoint<never>],
  ['predict', predictEndpoint as Endpoint<never>],
  ['rerank', rerankEndpoint as Endpoint<never>],
  ['similarity', similarityEndpoint as Endpoint<never>],
]);

/** The WebSocket ops that do not. */
export const TEI_LOCAL_ENDPOINTS: ReadonlyMap<string, LocalEndpoint> = new Map([
  ['tokenize', tokenizeEndpoint],
  ['decode', decodeEndpoint],
]);
