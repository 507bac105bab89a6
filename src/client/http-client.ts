/**
 * SlabHttpClient: the same API as SlabClient over plain HTTP (fetch), for
 * callers that cannot hold a socket (serverless functions, some proxies).
 *
 *   const http = new SlabHttpClient('http://localhost:8080');   // or SlabClient.http(...)
 *   const [row] = await http.embed('where is my parcel?');      // Float32Array
 *
 * Bodies go as msgpack by default (`format: 'json'` for JSON); answers are
 * read by their Content-Type. An error answer (status, `{error, type, code}`,
 * Retry-After) becomes a SlabClientError with `status` and
 * `retryAfterSeconds`; a network failure a SlabConnectionError; an aborted
 * signal a SlabAbortError; `timeoutMs` aborts the request and rejects with
 * SLABSERVE_CLIENT_TIMEOUT. Every call is one independent request: there is
 * no credit, queue or reconnect here.
 *
 * `apiKey` is sent as `Authorization: Bearer <key>` on every request; a
 * missing or wrong key is answered 401 and rejects with SlabUnauthorizedError
 * (type 'unauthorized', not retryable).
 */
import { pack, unpack } from 'msgpackr';
import { bearerHeader, checkApiKey } from './auth.js';
import { clientTimeout, fromHttpError, protocolError, SlabAbortError, SlabClientError, SlabConnectionError } from './errors.js';
import {
  decodeBody,
  decodedTexts,
  decodeList,
  decodeRowsOf,
  decodeScores,
  embedBody,
  predictBody,
  rerankBody,
  similarityBody,
  tokenizeBody,
  type CallOptions,
  type DecodeOptions,
  type EmbeddingRow,
  type EmbedOptions,
  type Prediction,
  type PredictOptions,
  type RerankHit,
  type RerankOptions,
  type SignedEmbeddingType,
  type SimilarityOptions,
  type SlabApi,
  type TextInputs,
  type TokenInputs,
  type TokenizeOptions,
  type TokenizeResult,
  type UnsignedEmbeddingType,
  type WireBody,
} from './types.js';

/** The part of a fetch Response this client reads. */
export interface FetchResponseLike {
  readonly ok: boolean;
  readonly status: number;
  readonly headers: { get(name: string): string | null };
  arrayBuffer(): Promise<ArrayBuffer>;
}

export type FetchLike = (
  url: string,
  init: { method: string; headers: Record<string, string>; body: Uint8Array | string; signal: AbortSignal },
) => Promise<FetchResponseLike>;

export interface SlabHttpClientOptions {
  /** fetch implementation. Default: globalThis.fetch. */
  fetch?: FetchLike;
  /** Request and answer encoding. Default 'msgpack'. */
  format?: 'msgpack' | 'json';
  /**
   * The server's API key (docs/security.md), sent as `Authorization: Bearer <key>`
   * on every request (it replaces an `authorization` in `headers`). Printable ASCII
   * without spaces, as the server's keys are; anything else throws a TypeError here.
   */
  apiKey?: string;
  /** Extra headers on every request. */
  headers?: Record<string, string>;
  /** Default per-call timeoutMs. Default: none. */
  timeoutMs?: number;
}

const MSGPACK = 'application/msgpack';

export class SlabHttpClient implements SlabApi {
  readonly baseUrl: string;
  private readonly opts: SlabHttpClientOptions;
  private readonly fetchImpl: FetchLike;
  private readonly headers: Record<string, string>;
  private closed = false;

  /** `baseUrl`: http(s)://host:port[/prefix]; ws(s):// is taken as http(s)://. */
  constructor(baseUrl: string | URL, options: SlabHttpClientOptions = {}) {
    const u = new URL(String(baseUrl));
    if (u.protocol === 'ws:') u.protocol = 'http:';
    else if (u.protocol === 'wss:') u.protocol = 'https:';
    if (u.pathname.endsWith('/ws')) u.pathname = u.pathname.slice(0, -3);
    this.baseUrl = u.toString().replace(/\/+$/, '');
    this.opts = options;
    this.headers = { ...options.headers };
    if (options.apiKey !== undefined) {
      const auth = bearerHeader(checkApiKey(options.apiKey));
      for (const name of Object.keys(this.headers)) if (name.toLowerCase() === 'authorization') delete this.headers[name];
      this.headers.authorization = auth;
    }
    const f = options.fetch ?? (globalThis as { fetch?: FetchLike }).fetch;
    if (!f) throw new TypeError('no fetch: pass options.fetch');
    this.fetchImpl = (url, init) => f(url, init); // never called as a method of this client
  }

  embed(inputs: TextInputs | TokenInputs, opts?: EmbedOptions & { embeddingType?: 'float' }): Promise<Float32Array[]>;
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions & { embeddingType: SignedEmbeddingType }): Promise<Int8Array[]>;
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions & { embeddingType: UnsignedEmbeddingType }): Promise<Uint8Array[]>;
  embed(inputs: TextInputs | TokenInputs, opts?: EmbedOptions): Promise<EmbeddingRow[]>;
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions = {}): Promise<EmbeddingRow[]> {
    // The HTTP API answers number[][] (quantized: bytes in msgpack, integer lists in JSON); decodeRows also takes f32 rows should it send those.
    return this.post('/embed', embedBody(inputs, opts, false), decodeRowsOf(opts.embeddingType), opts);
  }

  predict(inputs: string | readonly number[], opts?: PredictOptions): Promise<Prediction[]>;
  predict(inputs: readonly string[] | readonly (readonly number[])[], opts?: PredictOptions): Promise<Prediction[][]>;
  predict(inputs: TextInputs | TokenInputs, opts?: PredictOptions): Promise<Prediction[] | Prediction[][]>;
  predict(inputs: TextInputs | TokenInputs, opts: PredictOptions = {}): Promise<Prediction[] | Prediction[][]> {
    return this.post('/predict', predictBody(inputs, opts), decodeList<Prediction[] | Prediction[][]>('predict'), opts);
  }

  rerank(query: string, texts: readonly string[], opts: RerankOptions = {}): Promise<RerankHit[]> {
    return this.post('/rerank', rerankBody(query, texts, opts), decodeList<RerankHit[]>('rerank'), opts);
  }

  similarity(sourceSentence: string, sentences: readonly string[], opts: SimilarityOptions = {}): Promise<number[]> {
    return this.post('/similarity', similarityBody(sourceSentence, sentences, opts), decodeScores, opts);
  }

  tokenize(inputs: TextInputs, opts: TokenizeOptions = {}): Promise<TokenizeResult> {
    return this.post('/tokenize', tokenizeBody(inputs, opts), decodeList<TokenizeResult>('tokenize'), opts);
  }

  decode(ids: readonly number[], opts?: DecodeOptions): Promise<string>;
  decode(ids: readonly (readonly number[])[], opts?: DecodeOptions): Promise<string[]>;
  decode(ids: TokenInputs, opts?: DecodeOptions): Promise<string | string[]>;
  decode(ids: TokenInputs, opts: DecodeOptions = {}): Promise<string | string[]> {
    return this.post('/decode', decodeBody(ids, opts), decodedTexts(ids), opts);
  }

  /** Later calls reject with SLABSERVE_CLIENT_CLOSED (calls already made finish). */
  close(): Promise<void> {
    this.closed = true;
    return Promise.resolve();
  }

  private async post<T>(path: string, body: WireBody, decode: (payload: unknown) => T, opts: CallOptions): Promise<T> {
    if (this.closed) throw new SlabConnectionError('the client was closed', 'SLABSERVE_CLIENT_CLOSED');
    const signal = opts.signal;
    if (signal?.aborted) throw new SlabAbortError(signal.reason);
    const timeoutMs = opts.timeoutMs ?? this.opts.timeoutMs;
    if (timeoutMs !== undefined && !(timeoutMs > 0)) throw new RangeError('timeoutMs must be a positive number');

    const msgpack = (this.opts.format ?? 'msgpack') === 'msgpack';
    const headers: Record<string, string> = {
      ...this.headers,
      'content-type': msgpack ? MSGPACK : 'application/json',
      accept: msgpack ? MSGPACK : 'application/json',
    };
    const controller = new AbortController();
    let timedOut = false;
    const timer = timeoutMs !== undefined ? setTimeout(() => ((timedOut = true), controller.abort()), timeoutMs) : undefined;
    const onAbort = () => controller.abort(signal?.reason);
    signal?.addEventListener('abort', onAbort, { once: true });
    const failure = (err: unknown): SlabClientError => {
      if (timedOut) return clientTimeout(timeoutMs!, `POST ${path}`);
      if (signal?.aborted) return new SlabAbortError(signal.reason);
      if (err instanceof SlabClientError) return err;
      return new SlabConnectionError(`POST ${this.baseUrl}${path} failed: ${err instanceof Error ? err.message : String(err)}`, 'SLABSERVE_CONNECTION_FAILED', { cause: err });
    };
    try {
      let status: number;
      let ok: boolean;
      let contentType: string;
      let retryAfter: string | null;
      let bytes: Uint8Array;
      try {
        const res = await this.fetchImpl(this.baseUrl + path, {
          method: 'POST',
          headers,
          body: msgpack ? pack(body) : JSON.stringify(body),
          signal: controller.signal,
        });
        status = res.status;
        ok = res.ok;
        contentType = (res.headers.get('content-type') ?? '').toLowerCase();
        retryAfter = res.headers.get('retry-after');
        bytes = new Uint8Array(await res.arrayBuffer());
      } catch (err) {
        throw failure(err);
      }
      let payload: unknown;
      try {
        payload = decodePayload(bytes, contentType);
      } catch (err) {
        if (ok) throw protocolError(`cannot read the answer to POST ${path} (${contentType || 'no content type'}): ${(err as Error).message}`, err);
        payload = new TextDecoder().decode(bytes);
      }
      if (!ok) throw fromHttpError(status, payload, retryAfter);
      return decode(payload);
    } finally {
      if (timer !== undefined) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    }
  }
}

function decodePayload(bytes: Uint8Array, contentType: string): unknown {
  if (contentType.includes('msgpack')) return unpack(bytes);
  const text = new TextDecoder().decode(bytes);
  if (contentType.includes('json')) return JSON.parse(text);
  return text;
}
