/**
 * Request bodies, validated with zod. A failed parse becomes a
 * ValidationError whose message names the field and the problem. Every body
 * is a strict object: a field it does not know (a misspelled `normalise`) is
 * refused with the nearest known name, never silently ignored.
 */
import { z } from 'zod';
import { EMBEDDING_TYPES, isEmbeddingType } from '../core/quantized-embeddings.js';
import { FieldValidationError, UnknownFieldError, ValidationError } from '../shared/errors.js';
import { nearestName } from './nearest-name.js';
import { POOLINGS, TASKS, type Task } from '../shared/model-format/model-config.js';
import { LONG_INPUTS } from '../shared/options.js';

/** Token ids with the special tokens ([CLS] ... [SEP]): pre-tokenized input, as TEI and OpenAI take it. */
const tokenIds = z.array(z.number().int().nonnegative()).min(1);

/**
 * A text, one list of token ids, or a list of texts and/or token id lists.
 * Ids are checked against the model's vocabulary later (Infer.encodeIds).
 */
export const Inputs = z.union([z.string(), tokenIds, z.array(z.union([z.string(), tokenIds])).min(1, 'must not be an empty list')], {
  error: 'must be a string, a list of token ids, or a non-empty list of strings or token id lists',
});
const inputs = Inputs;

/** The longest `timeout` a request may ask for (an hour), and the longest priority class name. */
const MAX_TIMEOUT_MS = 3_600_000;
const MAX_PRIORITY_CHARS = 64;

/** Per-request scheduling fields, on every inference request (headers x-deadline-ms / x-priority do the same). */
const scheduling = {
  /** Ms from now after which the request must not run (it is answered 504, or 429 at once if it cannot make it). */
  timeout: z.number().positive().max(MAX_TIMEOUT_MS).optional(),
  /** Priority class: "interactive" (default) or "bulk" (or the classes of --priority-weights). */
  priority: z.string().max(MAX_PRIORITY_CHARS).optional(),
};

/** Which side a too-long input is cut on with `truncate`: TEI's "Right" / "Left" (either case). */
const truncation_direction = z
  .enum(['right', 'left', 'Right', 'Left'], { error: 'must be "right" or "left"' })
  .optional()
  .transform((v) => v?.toLowerCase() as 'right' | 'left' | undefined);

/** What happens to an input longer than the model takes (docs/long-inputs.md): overrides `truncate` and --long-inputs. */
const long_inputs = z.enum(LONG_INPUTS, { error: `must be one of ${LONG_INPUTS.map((m) => `"${m}"`).join(', ')}` }).optional();
/** The same, where the body's optional fields may be null (Cohere's routes). */
const longInputsNullish = z.enum(LONG_INPUTS, { error: `must be one of ${LONG_INPUTS.map((m) => `"${m}"`).join(', ')}` }).nullish();

/** Prompts (prompts.ts): a name of the model's prompts, or a text, put before each text input. */
const prompts = {
  prompt_name: z.string().optional(),
  prompt: z.string().optional(),
};

/** Quantized rows (core/quantized-embeddings.ts): Cohere's names. */
const embedding_type = z.enum(EMBEDDING_TYPES, { error: `must be one of ${EMBEDDING_TYPES.map((t) => `"${t}"`).join(', ')}` }).optional();

/** What /embed may answer per input instead of the dense row: any of these, each at most once (a BGE-M3 model gives all three from one pass). */
export const EMBED_OUTPUTS = ['dense', 'sparse', 'colbert'] as const;
export type EmbedOutput = (typeof EMBED_OUTPUTS)[number];

export const EmbedRequest = z.strictObject({
  ...scheduling,
  inputs,
  normalize: z.boolean().optional(),
  embedding_type,
  outputs: z
    .array(z.enum(EMBED_OUTPUTS, { error: `must be one of ${EMBED_OUTPUTS.map((o) => `"${o}"`).join(', ')}` }))
    .min(1)
    .refine((list) => new Set(list).size === list.length, 'names an output twice')
    .optional(),
  truncate: z.boolean().optional(),
  truncation_direction,
  long_inputs,
  model: z.string().optional(),
  ...prompts,
  /** Late chunking: [start, end) spans of the one text, a row each (core/late-chunking.ts checks them, naming the chunk). */
  chunks: z.array(z.unknown(), { error: 'must be a list of [start, end] spans' }).optional(),
});
export type EmbedRequest = z.infer<typeof EmbedRequest>;

/** POST /embed_sparse: TEI's body (no normalize: SPLADE weights are served as they are). */
export const EmbedSparseRequest = z.strictObject({
  ...scheduling,
  inputs,
  truncate: z.boolean().optional(),
  truncation_direction,
  long_inputs,
  model: z.string().optional(),
  ...prompts,
});
export type EmbedSparseRequest = z.infer<typeof EmbedSparseRequest>;

/** POST /embed_all: TEI's body, and `input_type` for a ColBERT model (PyLate's query or document marking). */
export const EmbedAllRequest = z.strictObject({
  ...EmbedSparseRequest.shape,
  input_type: z.enum(['query', 'document']).optional(),
});
export type EmbedAllRequest = z.infer<typeof EmbedAllRequest>;

/**
 * Hugging Face's text-classification parameters (its Inference API and
 * `@huggingface/inference`'s `textClassification`): how scores are made from
 * the logits, and how many labels to keep.
 */
const classificationParameters = z
  .strictObject({
    function_to_apply: z.enum(['softmax', 'sigmoid', 'none'], { error: 'must be "softmax", "sigmoid" or "none"' }).nullish(),
    top_k: z.number().int().positive().nullish(),
  })
  .nullish();

export const PredictRequest = z.strictObject({
  ...scheduling,
  inputs,
  raw_scores: z.boolean().optional(),
  truncate: z.boolean().optional(),
  truncation_direction,
  model: z.string().optional(),
  parameters: classificationParameters,
});
export type PredictRequest = z.infer<typeof PredictRequest>;

/** TEI's POST /rerank: score each text against the query with a cross-encoder. */
export const RerankRequest = z.strictObject({
  ...scheduling,
  query: z.string().min(1, 'must not be empty'),
  texts: z.array(z.string().min(1, 'must not be empty'), { error: 'must be a list of strings' }).min(1, 'must not be an empty list'),
  raw_scores: z.boolean().optional(),
  return_text: z.boolean().optional(),
  truncate: z.boolean().optional(),
  long_inputs,
  /** Cohere's name: the most windows of one text when it is chunked (the rest of it is cut). */
  max_chunks_per_doc: z.number().int().positive('must be at least 1').optional(),
  model: z.string().optional(),
});
export type RerankRequest = z.infer<typeof RerankRequest>;

/**
 * TEI's POST /similarity, Hugging Face's sentence-similarity task: the source
 * and the sentences embedded as one request, each sentence's cosine to the source.
 */
export const SimilarityRequest = z.strictObject({
  ...scheduling,
  inputs: z.strictObject(
    {
      source_sentence: z.string({ error: 'must be a string' }),
      sentences: z.array(z.string(), { error: 'must be a list of strings' }).min(1, 'must not be an empty list'),
    },
    { error: 'must be {"source_sentence": string, "sentences": string[]}' },
  ),
  parameters: z
    .strictObject({
      truncate: z.boolean().nullish(),
      truncation_direction,
      prompt_name: z.string().nullish(),
    })
    .nullish(),
  model: z.string().optional(),
});
export type SimilarityRequest = z.infer<typeof SimilarityRequest>;

/** TEI's POST /tokenize. */
export const TokenizeRequest = z.strictObject({
  inputs: z.union([z.string(), z.array(z.string()).min(1, 'must not be an empty list')], { error: 'must be a string or a list of strings' }),
  add_special_tokens: z.boolean().optional(),
  model: z.string().optional(),
});
export type TokenizeRequest = z.infer<typeof TokenizeRequest>;

const ids = z.array(z.number().int().nonnegative());
/** TEI's POST /decode: one list of ids (answered with a string) or a list of them (a list of strings). */
export const DecodeRequest = z.strictObject({
  ids: z.union([ids, z.array(ids).min(1, 'must not be an empty list')], { error: 'must be a list of token ids or a list of such lists' }),
  skip_special_tokens: z.boolean().optional(),
  model: z.string().optional(),
});
export type DecodeRequest = z.infer<typeof DecodeRequest>;

/** OpenAI's POST /v1/embeddings. */
export const OpenAIEmbeddingRequest = z.strictObject({
  input: Inputs,
  model: z.string({ error: 'you must name a model' }).min(1, 'must not be empty'),
  encoding_format: z.enum(['float', 'base64'], { error: 'must be "float" or "base64"' }).optional(),
  /** Our extension (Cohere's field): quantized vectors, integer lists or the base64 of their bytes. */
  embedding_type,
  dimensions: z.number().int().positive().optional(),
  user: z.string().optional(),
  ...prompts,
  /** Our extension (TEI's field): cut a too-long input instead of refusing it. */
  truncate: z.boolean().optional(),
  truncation_direction,
  /** Our extension: what happens to a too-long input (docs/long-inputs.md). */
  long_inputs,
  /** Our extension: what integer inputs are, OpenAI's cl100k_base ids (the default) or the served model's own. */
  token_encoding: z.enum(['cl100k_base', 'model'], { error: 'must be "cl100k_base" or "model"' }).optional(),
});
export type OpenAIEmbeddingRequest = z.infer<typeof OpenAIEmbeddingRequest>;

/** A KServe v2 tensor: data flat in row-major order (nested lists are flattened). */
const KServeTensor = z.strictObject({
  name: z.string().min(1),
  shape: z.array(z.number().int().nonnegative()),
  datatype: z.string(),
  data: z.array(z.unknown()),
  parameters: z.record(z.string(), z.unknown()).optional(),
});
export type KServeTensor = z.infer<typeof KServeTensor>;

/** KServe v2 / Triton POST /v2/models/{name}/infer (the JSON form; not the binary tensor extension). */
export const KServeInferRequest = z.strictObject({
  id: z.string().optional(),
  parameters: z.record(z.string(), z.unknown()).optional(),
  inputs: z.array(KServeTensor).min(1, 'must not be an empty list'),
  outputs: z.array(z.strictObject({ name: z.string(), parameters: z.record(z.string(), z.unknown()).optional() })).optional(),
});
export type KServeInferRequest = z.infer<typeof KServeInferRequest>;

// ------------------------------------------------------------ the model repository (Triton's extension)

/** serve.json's fields: what a load's `parameters.config` may set over the folder's own. */
export const ServeSettingsSchema = z.strictObject({
  task: z.enum(TASKS as [Task, ...Task[]]).optional(),
  pooling: z.enum([...POOLINGS, 'splade']).optional(),
  normalize: z.boolean().optional(),
  maxLength: z.number().int().positive().optional(),
  defaultPromptName: z.string().optional(),
  defaultPrompt: z.string().optional(),
});

export const RepositoryIndexRequest = z.strictObject({ ready: z.boolean().optional() });
export const RepositoryLoadRequest = z.strictObject({
  parameters: z.strictObject({ config: z.union([z.string(), z.record(z.string(), z.unknown())]).optional() }).optional(),
});
export const RepositoryUnloadRequest = z.strictObject({
  parameters: z.strictObject({ unload_dependents: z.boolean().optional() }).optional(),
});

// ------------------------------------------------------------ the hot bodies without zod

/**
 * /embed and /predict bodies (and their WebSocket ops) of the common shape,
 * checked by hand: a general schema library costs more per request than the
 * rest of the gateway's parsing. `inputs` a text, token ids, or a list of
 * those; the optional fields of the right types. Anything else, valid or not,
 * is null here and goes to the zod schema, which owns the error messages; a
 * result here is exactly what the schema would have produced (fuzzed against
 * it in test/schemas.test.ts).
 */
export function quickEmbedRequest(body: unknown): EmbedRequest | null {
  const out = quickInputsBody(body, EMBED_FLAGS, EMBED_FIELDS);
  if (out === null) return null;
  const type = (body as { embedding_type?: unknown }).embedding_type;
  if (type === undefined) return out as EmbedRequest;
  if (!isEmbeddingType(type)) return null; // the schema's error
  out.embedding_type = type;
  return out as EmbedRequest;
}

export function quickPredictRequest(body: unknown): PredictRequest | null {
  return quickInputsBody(body, PREDICT_FLAGS, PREDICT_FIELDS) as PredictRequest | null;
}

const EMBED_FLAGS = ['normalize', 'truncate'] as const;
const PREDICT_FLAGS = ['raw_scores', 'truncate'] as const;
/** The fields the quick checks take (a body with any other goes to the schema, which refuses an unknown one). */
const EMBED_FIELDS: ReadonlySet<string> = new Set([...EMBED_FLAGS, 'inputs', 'model', 'timeout', 'priority', 'embedding_type']);
const PREDICT_FIELDS: ReadonlySet<string> = new Set([...PREDICT_FLAGS, 'inputs', 'model', 'timeout', 'priority']);

function quickInputsBody(raw: unknown, flags: readonly string[], fields: ReadonlySet<string>): Record<string, unknown> | null {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return null;
  const b = raw as Record<string, unknown>;
  if (!quickInputs(b.inputs)) return null;
  for (const k in b) if (!fields.has(k)) return null;
  // Rare fields: the schema's, and its errors.
  if (b.prompt_name !== undefined || b.prompt !== undefined || b.truncation_direction !== undefined) return null;
  const out: Record<string, unknown> = { inputs: b.inputs };
  for (const k of flags) {
    const v = b[k];
    if (v === undefined) continue;
    if (typeof v !== 'boolean') return null;
    out[k] = v;
  }
  const { model, timeout, priority } = b;
  if (model !== undefined) {
    if (typeof model !== 'string') return null;
    out.model = model;
  }
  if (timeout !== undefined) {
    if (typeof timeout !== 'number' || !Number.isFinite(timeout) || !(timeout > 0) || timeout > MAX_TIMEOUT_MS) return null;
    out.timeout = timeout;
  }
  if (priority !== undefined) {
    if (typeof priority !== 'string' || priority.length > MAX_PRIORITY_CHARS) return null;
    out.priority = priority;
  }
  return out;
}

/** A text, one list of token ids, or a non-empty list of texts and non-empty id lists. */
function quickInputs(x: unknown): boolean {
  if (typeof x === 'string') return true;
  if (!Array.isArray(x) || x.length === 0) return false;
  if (typeof x[0] === 'number') return isTokenIds(x);
  for (const e of x) if (typeof e !== 'string' && !(Array.isArray(e) && e.length > 0 && isTokenIds(e))) return false;
  return true;
}

function isTokenIds(a: unknown[]): boolean {
  for (const v of a) if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < 0) return false;
  return true;
}

/** Parses `body` with `schema` or throws a ValidationError listing every problem. */
export function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new ValidationError('the body must be an object, e.g. {"inputs": "some text"}');
  }
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const unknown = r.error.issues.find((i) => i.code === 'unrecognized_keys');
  if (unknown) throw unknownFieldError(schema, unknown.path, unknown.keys[0]!);
  const problems = r.error.issues.map((i) => `${i.path.length ? i.path.join('.') : 'body'}: ${i.message}`);
  const first = r.error.issues[0]?.path[0];
  throw new FieldValidationError(`invalid request: ${problems.join('; ')}`, first === undefined ? null : String(first));
}

/** `key` is not a field of the object at `path`: named with the nearest field that is, or the list of them. */
function unknownFieldError(schema: z.ZodType, path: PropertyKey[], key: string): UnknownFieldError {
  const known = fieldsAt(schema, path);
  const field = [...path.map(String), key].join('.');
  const near = nearestName(key, known);
  const hint = near !== null ? `did you mean "${near}"?` : `the fields are ${known.join(', ')}`;
  return new UnknownFieldError(`invalid request: unknown field "${field}": ${hint}`, field, near);
}

/** The field names of the object schema at `path` inside `schema` (through optional, nullable and list wrappers). */
function fieldsAt(schema: z.ZodType, path: PropertyKey[]): string[] {
  let s: unknown = schema;
  for (let i = 0; ; ) {
    if (s instanceof z.ZodOptional || s instanceof z.ZodNullable) s = s.unwrap();
    else if (s instanceof z.ZodPipe) s = s.in;
    else if (s instanceof z.ZodArray && i < path.length) [s, i] = [s.element, i + 1];
    else if (s instanceof z.ZodObject && i < path.length) [s, i] = [s.shape[String(path[i])], i + 1];
    else return s instanceof z.ZodObject ? Object.keys(s.shape) : [];
  }
}

// ------------------------------------------------------------ Cohere's and Jina's bodies (src/gateway/cohere/)
//
// Like Cohere's, Jina's and vLLM's servers, these routes ignore a field they do not know (z.object,
// not strictObject): the official clients send fields a self-hosted server has no use for. An
// optional field may be null (LangChain's CohereRerank sends max_chunks_per_doc: null).

/** A document to rerank: a text, or an object with a `text` (Cohere's and Jina's document objects; other fields kept). */
const rerankDocument = z.union([z.string(), z.looseObject({ text: z.string({ error: 'must be a string' }) })], {
  error: 'must be a string or an object with a "text" string',
});
export type RerankDocument = z.infer<typeof rerankDocument>;

const topN = z.number().int().positive('must be at least 1').nullish();

/** Cohere's POST /v2/rerank (cohere-ai's V2RerankRequest). */
export const CohereV2RerankRequest = z.object({
  model: z.string({ error: 'you must name a model' }).min(1, 'must not be empty'),
  query: z.string({ error: 'must be a string' }).min(1, 'must not be empty'),
  documents: z.array(rerankDocument, { error: 'must be a list of documents' }).min(1, 'must not be an empty list'),
  top_n: topN,
  max_tokens_per_doc: z.number().int().positive('must be at least 1').nullish(),
  /** Cohere's v1 field, taken here too: chunk a long document, at most this many windows. */
  max_chunks_per_doc: z.number().int().positive('must be at least 1').nullish(),
  long_inputs: longInputsNullish,
  priority: z.number().int().nullish(),
});
export type CohereV2RerankRequest = z.infer<typeof CohereV2RerankRequest>;

/** Cohere's v1 and Jina's POST /v1/rerank (cohere-ai's RerankRequest; Jina's rerank API). */
export const CohereV1RerankRequest = z.object({
  model: z.string().nullish(),
  query: z.union([z.string().min(1, 'must not be empty'), z.looseObject({ text: z.string().min(1, 'must not be empty') })], { error: 'must be a string or {"text": string}' }),
  documents: z.array(rerankDocument, { error: 'must be a list of documents' }).min(1, 'must not be an empty list'),
  top_n: topN,
  return_documents: z.boolean().nullish(),
  rank_fields: z.array(z.string()).nullish(),
  max_chunks_per_doc: z.number().int().positive('must be at least 1').nullish(),
  max_tokens_per_doc: z.number().int().positive('must be at least 1').nullish(),
  /** Our extension (TEI's name): false refuses a document past the model's length instead of cutting it (the default). */
  truncate: z.boolean().nullish(),
  long_inputs: longInputsNullish,
  priority: z.number().int().nullish(),
});
export type CohereV1RerankRequest = z.infer<typeof CohereV1RerankRequest>;

/** Cohere's `input_type`s of texts (its `image` is not served). */
export const COHERE_INPUT_TYPES = ['search_document', 'search_query', 'classification', 'clustering'] as const;
/** Cohere's `embedding_types`: the quantized rows' names, and `base64` (the float32 bytes). */
export const COHERE_EMBEDDING_TYPES = [...EMBEDDING_TYPES, 'base64'] as const;

/** Cohere's POST /v2/embed (cohere-ai's V2EmbedRequest), texts only. */
export const CohereV2EmbedRequest = z.object({
  model: z.string({ error: 'you must name a model' }).min(1, 'must not be empty'),
  texts: z.array(z.string({ error: 'must be a string' }).min(1, 'must not be empty'), { error: 'must be a list of strings' }).min(1, 'must not be an empty list'),
  input_type: z.enum(COHERE_INPUT_TYPES, { error: `must be one of ${COHERE_INPUT_TYPES.map((t) => `"${t}"`).join(', ')} (images are not served)` }),
  embedding_types: z
    .array(z.enum(COHERE_EMBEDDING_TYPES, { error: `must be one of ${COHERE_EMBEDDING_TYPES.map((t) => `"${t}"`).join(', ')}` }))
    .min(1, 'must not be an empty list')
    .nullish(),
  output_dimension: z.number().int().positive('must be at least 1').nullish(),
  max_tokens: z.number().int().positive('must be at least 1').nullish(),
  truncate: z.enum(['NONE', 'START', 'END'], { error: 'must be "NONE", "START" or "END"' }).nullish(),
  long_inputs: longInputsNullish,
  priority: z.number().int().nullish(),
  images: z.array(z.unknown()).max(0, 'images are not served: send texts').nullish(),
  inputs: z.array(z.unknown()).max(0, 'inputs of text and image parts are not served: send texts').nullish(),
});
export type CohereV2EmbedRequest = z.infer<typeof CohereV2EmbedRequest>;

// ------------------------------------------------------------ vLLM's pooling bodies (src/gateway/vllm/)
//
// vLLM ignores a field it does not use (its OpenAIBaseModel logs it): so do these, z.object.

/** vLLM's ScoreInput: a text, or a multimodal param whose parts are text parts ({type: "text", text}). */
const scoreInput = z.union([
  z.string({ error: 'must be a string' }),
  z.looseObject({
    content: z.array(z.looseObject({ type: z.literal('text', { error: 'only text parts are served' }), text: z.string() }), { error: 'must be a list of text parts' }),
  }),
]);
export type ScoreInput = z.infer<typeof scoreInput>;
const scoreInputs = z.union([scoreInput, z.array(scoreInput)], { error: 'must be a text, {"content": [text parts]}, or a list of those' });

/** The fields every vLLM pooling request has (PoolingBasicRequestMixin, ClassifyRequestMixin). */
const vllmCommon = {
  model: z.string().nullish(),
  user: z.string().nullish(),
  truncate_prompt_tokens: z.number().int().min(-1, 'must be -1 (the model\'s length) or a number of tokens').nullish(),
  truncation_side: z.enum(['left', 'right'], { error: 'must be "left" or "right"' }).nullish(),
  request_id: z.string().nullish(),
  priority: z.number().int().nullish(),
  use_activation: z.boolean().nullish(),
  /** Older names of use_activation. */
  softmax: z.boolean().nullish(),
  activation: z.boolean().nullish(),
};

/** vLLM's POST /score and /v1/score: queries/documents (current), text_1/text_2 (older), queries/items, data_1/data_2. */
export const VllmScoreRequest = z.object({
  ...vllmCommon,
  queries: scoreInputs.optional(),
  documents: scoreInputs.optional(),
  items: scoreInputs.optional(),
  text_1: scoreInputs.optional(),
  text_2: scoreInputs.optional(),
  data_1: scoreInputs.optional(),
  data_2: scoreInputs.optional(),
  max_tokens_per_query: z.number().int().nonnegative().nullish(),
  max_tokens_per_doc: z.number().int().nonnegative().nullish(),
  instruction: z.string().nullish(),
});
export type VllmScoreRequest = z.infer<typeof VllmScoreRequest>;

/** vLLM's POST /classify and /v1/classify (ClassificationCompletionRequest); `messages` (its chat form) is refused. */
export const VllmClassifyRequest = z.object({
  ...vllmCommon,
  input: Inputs,
  add_special_tokens: z.boolean().nullish(),
  messages: z.undefined({ error: 'the chat form (messages) is not served: send input' }).optional(),
});
export type VllmClassifyRequest = z.infer<typeof VllmClassifyRequest>;
