/**
 * What both clients (WebSocket and HTTP) take and return, and the mapping of
 * their options to the wire (camelCase here, snake_case on the wire).
 */
import { protocolError } from './errors.js';

/** One text, or a list of texts. (embed and predict also take token ids: one list of integers, or a list of such lists, special tokens included.) */
export type TextInputs = string | readonly string[];
export type TokenInputs = readonly number[] | readonly (readonly number[])[];

export interface CallOptions {
  /** Model name; default: the server's first model of the right task. */
  model?: string;
  /** Aborts the call: over WebSocket a cancel frame is sent and the promise rejects at once with SlabAbortError. */
  signal?: AbortSignal;
  /**
   * Milliseconds for the whole call. Over WebSocket it is sent as `deadline_ms` (what is left of it
   * when the request leaves the client's queue), and the client gives up on its own a grace period
   * later; over HTTP the request is aborted after it. Default: the client's `timeoutMs` option.
   */
  timeoutMs?: number;
}

/**
 * Quantized rows (the server's `embedding_type`, Cohere's names; README.md, HTTP API):
 * 'int8' and 'binary' come back as Int8Array rows, 'uint8' and 'ubinary' as Uint8Array,
 * 'float' (the default) as Float32Array. binary/ubinary pack 8 dimensions per byte.
 */
export type EmbeddingType = 'float' | 'int8' | 'uint8' | 'binary' | 'ubinary';
export type SignedEmbeddingType = 'int8' | 'binary';
export type UnsignedEmbeddingType = 'uint8' | 'ubinary';
/** What happens to an input longer than the model takes (the server's --long-inputs, a request's long_inputs). */
export type LongInputs = 'error' | 'truncate' | 'chunk';
/** A row of any embedding type. */
export type EmbeddingRow = Float32Array | Int8Array | Uint8Array;

export interface EmbedOptions extends CallOptions {
  /** L2-normalise (default: the model's setting). int8 and uint8 rows are always of the normalised row: false is refused with them. */
  normalize?: boolean;
  /** Cut inputs longer than the model's max length instead of failing with too_long. */
  truncate?: boolean;
  /** What happens to an input longer than the model takes: refused, cut, or run as windows and combined (docs/long-inputs.md); default the server's. */
  longInputs?: LongInputs;
  /** WebSocket: 'f32' (default) asks for raw little-endian float32 rows; 'json' for arrays of numbers. (Quantized rows always come as bytes.) */
  encoding?: 'f32' | 'json';
  /** Quantized rows instead of floats (default 'float'). */
  embeddingType?: EmbeddingType;
}

export interface SimilarityOptions extends CallOptions {
  /** Cut inputs longer than the model's max length instead of failing with too_long. */
  truncate?: boolean;
  /** One of the model's prompts, put before the source and every sentence (default: the model's default prompt). */
  promptName?: string;
}

export interface PredictOptions extends CallOptions {
  /** Logits instead of probabilities. */
  rawScores?: boolean;
  truncate?: boolean;
}

export interface RerankOptions extends CallOptions {
  rawScores?: boolean;
  /** Send each text back in its hit. */
  returnText?: boolean;
  truncate?: boolean;
  /** As EmbedOptions.longInputs: a long text is scored by its best window. */
  longInputs?: LongInputs;
  /** Chunked, the most windows of one text (Cohere's max_chunks_per_doc); setting it chunks. */
  maxChunksPerDoc?: number;
}

export interface TokenizeOptions extends CallOptions {
  /** Add [CLS]/[SEP] and the like (server default when absent). */
  addSpecialTokens?: boolean;
}

export interface DecodeOptions extends CallOptions {
  /** Leave [CLS]/[SEP] and the like out of the text (server default when absent: true). */
  skipSpecialTokens?: boolean;
}

/** One label and its score; predict answers them sorted by score, highest first. */
export interface Prediction {
  label: string;
  score: number;
}

/** One reranked text: its index in `texts`, its score, and the text itself with returnText. Sorted by score. */
export interface RerankHit {
  index: number;
  score: number;
  text?: string;
}

/** One token of a /tokenize answer (TEI's shape); offsets in code points, null for special tokens. */
export interface TokenInfo {
  id: number;
  text: string;
  special: boolean;
  start: number | null;
  stop: number | null;
}

/** Per input, its tokens: always a list of lists, even for one text. */
export type TokenizeResult = TokenInfo[][];

/** The API both clients offer, with the same result types. */
export interface SlabApi {
  /** One Float32Array per input, in input order. */
  embed(inputs: TextInputs | TokenInputs, opts?: EmbedOptions & { embeddingType?: 'float' }): Promise<Float32Array[]>;
  /** Quantized: one Int8Array per input (int8: a byte a dimension; binary: 8 dimensions a byte). */
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions & { embeddingType: SignedEmbeddingType }): Promise<Int8Array[]>;
  /** Quantized: one Uint8Array per input (uint8: a byte a dimension; ubinary: 8 dimensions a byte). */
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions & { embeddingType: UnsignedEmbeddingType }): Promise<Uint8Array[]>;
  embed(inputs: TextInputs | TokenInputs, opts?: EmbedOptions): Promise<EmbeddingRow[]>;
  /** One text (or one token-id list): its predictions. */
  predict(inputs: string | readonly number[], opts?: PredictOptions): Promise<Prediction[]>;
  /** A list: one list of predictions per input. */
  predict(inputs: readonly string[] | readonly (readonly number[])[], opts?: PredictOptions): Promise<Prediction[][]>;
  predict(inputs: TextInputs | TokenInputs, opts?: PredictOptions): Promise<Prediction[] | Prediction[][]>;
  rerank(query: string, texts: readonly string[], opts?: RerankOptions): Promise<RerankHit[]>;
  /** The cosine similarity of each sentence's embedding to the source sentence's, in order (TEI's /similarity). */
  similarity(sourceSentence: string, sentences: readonly string[], opts?: SimilarityOptions): Promise<number[]>;
  /** Per input, its tokens (no inference). */
  tokenize(inputs: TextInputs, opts?: TokenizeOptions): Promise<TokenizeResult>;
  /** One list of token ids: its text (no inference). */
  decode(ids: readonly number[], opts?: DecodeOptions): Promise<string>;
  /** A list of lists: one text per list. */
  decode(ids: readonly (readonly number[])[], opts?: DecodeOptions): Promise<string[]>;
  decode(ids: TokenInputs, opts?: DecodeOptions): Promise<string | string[]>;
  close(): Promise<void>;
}

export type Op = 'embed' | 'predict' | 'rerank' | 'tokenize' | 'decode' | 'similarity';

/** A request's fields, as sent (without id, op, deadline_ms). */
export type WireBody = Record<string, unknown>;

function put(body: WireBody, key: string, value: unknown): void {
  if (value !== undefined) body[key] = value;
}

export function embedBody(inputs: TextInputs | TokenInputs, opts: EmbedOptions, f32: boolean): WireBody {
  const body: WireBody = { inputs };
  put(body, 'model', opts.model);
  put(body, 'normalize', opts.normalize);
  put(body, 'truncate', opts.truncate);
  put(body, 'long_inputs', opts.longInputs);
  if (opts.embeddingType !== undefined && opts.embeddingType !== 'float') body.embedding_type = opts.embeddingType;
  else if (f32) body.encoding = 'f32';
  return body;
}

export function predictBody(inputs: TextInputs | TokenInputs, opts: PredictOptions): WireBody {
  const body: WireBody = { inputs };
  put(body, 'model', opts.model);
  put(body, 'raw_scores', opts.rawScores);
  put(body, 'truncate', opts.truncate);
  return body;
}

export function rerankBody(query: string, texts: readonly string[], opts: RerankOptions): WireBody {
  const body: WireBody = { query, texts };
  put(body, 'model', opts.model);
  put(body, 'raw_scores', opts.rawScores);
  put(body, 'return_text', opts.returnText);
  put(body, 'truncate', opts.truncate);
  put(body, 'long_inputs', opts.longInputs);
  put(body, 'max_chunks_per_doc', opts.maxChunksPerDoc);
  return body;
}

export function similarityBody(sourceSentence: string, sentences: readonly string[], opts: SimilarityOptions): WireBody {
  const body: WireBody = { inputs: { source_sentence: sourceSentence, sentences } };
  const parameters: WireBody = {};
  put(parameters, 'truncate', opts.truncate);
  put(parameters, 'prompt_name', opts.promptName);
  if (Object.keys(parameters).length > 0) body.parameters = parameters;
  put(body, 'model', opts.model);
  return body;
}

export function tokenizeBody(inputs: TextInputs, opts: TokenizeOptions): WireBody {
  const body: WireBody = { inputs };
  put(body, 'model', opts.model);
  put(body, 'add_special_tokens', opts.addSpecialTokens);
  return body;
}

export function decodeBody(ids: TokenInputs, opts: DecodeOptions): WireBody {
  const body: WireBody = { ids };
  put(body, 'model', opts.model);
  put(body, 'skip_special_tokens', opts.skipSpecialTokens);
  return body;
}

/** A decode answer: one string for one list of ids (the server's rule: empty, or starting with a number), else one per list. */
export function decodedTexts(ids: TokenInputs): (result: unknown) => string | string[] {
  const single = ids.length === 0 || typeof ids[0] === 'number';
  return (result) => {
    if (single ? typeof result === 'string' : Array.isArray(result) && result.every((t) => typeof t === 'string')) return result as string | string[];
    throw protocolError(`a decode answer must be ${single ? 'a string' : 'a list of strings'}`);
  };
}

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** Little-endian float32 bytes to a fresh Float32Array (never a view on the frame's memory). */
export function decodeF32(bytes: Uint8Array): Float32Array {
  if (bytes.byteLength % 4 !== 0) throw protocolError(`an f32 row has ${bytes.byteLength} bytes, not a multiple of 4`);
  const out = new Float32Array(bytes.byteLength / 4);
  if (LITTLE_ENDIAN) {
    new Uint8Array(out.buffer).set(bytes);
  } else {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(i * 4, true);
  }
  return out;
}

/** An embed answer, f32 rows (`bin`) or number[][], to Float32Array rows. */
export function decodeRows(result: unknown): Float32Array[] {
  if (!Array.isArray(result)) throw protocolError('an embed answer must be a list of rows');
  return result.map((row: unknown) => {
    if (row instanceof Uint8Array) return decodeF32(row);
    if (row instanceof ArrayBuffer) return decodeF32(new Uint8Array(row));
    if (ArrayBuffer.isView(row)) return decodeF32(new Uint8Array(row.buffer, row.byteOffset, row.byteLength));
    if (Array.isArray(row)) return Float32Array.from(row as number[]);
    throw protocolError('an embed row must be bytes (f32) or a list of numbers');
  });
}

/** A quantized row's bytes (`bin`) or integer list, copied (never a view on the frame's memory). */
function quantizedRow(row: unknown, signed: boolean): Int8Array | Uint8Array {
  let bytes: Uint8Array;
  if (row instanceof Uint8Array) bytes = row;
  else if (row instanceof ArrayBuffer) bytes = new Uint8Array(row);
  else if (ArrayBuffer.isView(row)) bytes = new Uint8Array(row.buffer, row.byteOffset, row.byteLength);
  else if (Array.isArray(row) && row.every((v) => Number.isInteger(v))) return signed ? Int8Array.from(row as number[]) : Uint8Array.from(row as number[]);
  else throw protocolError('a quantized embed row must be bytes or a list of integers');
  const copy = new Uint8Array(bytes);
  return signed ? new Int8Array(copy.buffer) : copy;
}

/** An embed answer to rows of `type`: Float32Array for float, Int8Array for int8/binary, Uint8Array for uint8/ubinary. */
export function decodeRowsOf(type: EmbeddingType | undefined): (result: unknown) => EmbeddingRow[] {
  if (type === undefined || type === 'float') return decodeRows;
  const signed = type === 'int8' || type === 'binary';
  return (result) => {
    if (!Array.isArray(result)) throw protocolError('an embed answer must be a list of rows');
    return result.map((row: unknown) => quantizedRow(row, signed));
  };
}

/** A similarity answer: one number per sentence. */
export function decodeScores(result: unknown): number[] {
  if (!Array.isArray(result) || !result.every((v) => typeof v === 'number')) throw protocolError('a similarity answer must be a list of numbers');
  return result;
}

export function decodeList<T>(what: string): (result: unknown) => T {
  return (result) => {
    if (!Array.isArray(result)) throw protocolError(`a ${what} answer must be a list`);
    return result as T;
  };
}
