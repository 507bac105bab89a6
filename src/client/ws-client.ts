/**
 * SlabClient: the slabserve API over one WebSocket (/ws, docs/websocket.md),
 * for Node.js and browsers.
 *
 *   const client = await SlabClient.connect('ws://localhost:8080/ws');
 *   const [row] = await client.embed('where is my parcel?');   // Float32Array
 *   await client.close();
 *
 * - Pipelining: many requests in flight on one socket, answers matched by id
 *   in whatever order they come.
 * - Credit: `hello` asks for `credit`; the client never has more requests in
 *   flight than the server granted. Beyond it, calls wait in a local FIFO
 *   (at most `maxQueued`, then SLABSERVE_CLIENT_QUEUE_FULL). A request counts
 *   against the credit until the server answers it, even after the caller
 *   gave up on it (abort, timeout): the server holds its slot until then.
 * - Cancellation: `signal` sends `{op: "cancel", id}` and rejects at once.
 * - Deadlines: `timeoutMs` is sent as `deadline_ms` (what is left of it when
 *   the request leaves the queue); the client gives up `timeoutGraceMs` later
 *   if no answer came.
 * - Reconnect: when the socket drops, requests in flight on it reject with
 *   SlabConnectionError (SLABSERVE_CONNECTION_LOST: they may or may not have
 *   run), unless `retryOnReconnect` (every op is idempotent, so resending is
 *   safe, but the work may run twice). The client reconnects with capped
 *   exponential backoff and jitter; calls made meanwhile wait for the new
 *   socket, bounded by their timeout and `maxQueued`.
 * - API keys: `apiKey` goes with the upgrade, as `Authorization: Bearer <key>`
 *   with the `ws` package (Node), else as a `bearer.<base64url(key)>`
 *   subprotocol beside `slabserve` (browsers cannot set headers). An upgrade
 *   refused with 401 rejects with SlabUnauthorizedError and is never retried:
 *   connect() rejects with it, and a reconnect that gets it closes the client.
 *   (Browsers do not tell a page why an upgrade failed, so there a 401 looks
 *   like any failed connection and is retried: bound it with maxAttempts.)
 */
import { pack, unpack } from 'msgpackr';
import { bearerHeader, checkApiKey, WS_PROTOCOL, wsKeyProtocol } from './auth.js';
import {
  clientTimeout,
  fromServerError,
  protocolError,
  SlabAbortError,
  SlabClientError,
  SlabConnectionError,
  SlabUnauthorizedError,
} from './errors.js';
import { SlabHttpClient, type SlabHttpClientOptions } from './http-client.js';
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
  type Op,
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

/**
 * The part of the WHATWG WebSocket this client uses (browsers, Node >= 22,
 * and the `ws` package all have it). Events are `any` so that the DOM's and
 * ws's event types both fit.
 */
export interface WebSocketLike {
  binaryType: string;
  readonly readyState: number;
  onopen: ((event: any) => void) | null;
  /** `event.data`: an ArrayBuffer for binary frames (binaryType 'arraybuffer'). */
  onmessage: ((event: any) => void) | null;
  /** `event.code`, `event.reason`. */
  onclose: ((event: any) => void) | null;
  onerror: ((event: any) => void) | null;
  send(data: Uint8Array): void;
  close(code?: number, reason?: string): void;
}

/**
 * A WebSocket constructor. The third argument is the `ws` package's options;
 * the client passes it (`{headers: {authorization}}`) only to send an API key
 * as a header (see SlabClientOptions.apiKeyTransport).
 */
export type WebSocketConstructor = new (url: string, protocols?: string | string[], options?: { headers?: Record<string, string> }) => WebSocketLike;

export interface ReconnectOptions {
  /** Delay before the first attempt after a drop, ms. Default 100. */
  initialDelayMs?: number;
  /** Longest delay between attempts, ms. Default 10000. */
  maxDelayMs?: number;
  /** Growth of the delay per failed attempt. Default 2. */
  factor?: number;
  /** Fraction of each delay drawn at random (0: none, 1: full jitter). Default 0.5: delay in [base/2, base]. */
  jitter?: number;
  /** Consecutive failed attempts before giving up (the client then closes). Default Infinity. */
  maxAttempts?: number;
}

export interface SlabClientOptions {
  /** WebSocket constructor. Default: in Node the `ws` package (else globalThis.WebSocket); elsewhere globalThis.WebSocket. */
  WebSocket?: WebSocketConstructor;
  /** Subprotocols for the WebSocket constructor. */
  protocols?: string | string[];
  /**
   * The server's API key (docs/security.md), checked once at the upgrade.
   * Printable ASCII without spaces, as the server's keys are (else a TypeError).
   * A missing or wrong key: SlabUnauthorizedError (type 'unauthorized'), never retried.
   */
  apiKey?: string;
  /**
   * How `apiKey` travels:
   * - 'header': `Authorization: Bearer <key>`, given to the constructor as the `ws`
   *   package's third argument, `{headers}` (the constructor must take it);
   * - 'protocol': the subprotocol `bearer.<base64url(key)>`, offered with `slabserve`
   *   (the server answers `slabserve`, never the key), for browsers.
   * Default: 'header' when the constructor is the `ws` package (in Node the client
   * loads `ws` even where a global WebSocket exists), else 'protocol'.
   */
  apiKeyTransport?: 'header' | 'protocol';
  /** Requests in flight asked for in `hello`; the server may grant fewer. Default 256. */
  credit?: number;
  /** Calls waiting locally (beyond the credit, or while reconnecting) before new ones are refused. Default 1024. */
  maxQueued?: number;
  /** Default per-call timeoutMs. Default: none (the server's --request-timeout-ms applies once sent). */
  timeoutMs?: number;
  /** How long after a sent request's deadline the client stops waiting for the server's answer. Default 1000. */
  timeoutGraceMs?: number;
  /** Opening the socket plus the hello exchange, ms. Default 10000. */
  connectTimeoutMs?: number;
  /** Reconnect after a drop (default true, with the defaults of ReconnectOptions); false: the client closes. */
  reconnect?: boolean | ReconnectOptions;
  /**
   * Resend the requests that were in flight when the socket dropped, once
   * reconnected, instead of rejecting them with SLABSERVE_CONNECTION_LOST.
   * Default false. Every op is idempotent, so this is safe, but a request may
   * then run twice on the server (once before the drop, once after).
   */
  retryOnReconnect?: boolean;
  /** Connection life-cycle events (for logs and metrics). */
  onEvent?: (event: SlabClientEvent) => void;
}

export type SlabClientEvent =
  | { type: 'open'; reconnected: boolean; credit: number }
  | { type: 'disconnect'; code: number; reason: string; inflight: number }
  | { type: 'reconnecting'; attempt: number; delayMs: number }
  | { type: 'reconnect_failed'; attempt: number; error: SlabClientError }
  | { type: 'gave_up'; attempts: number; error: SlabClientError }
  /** An error frame with `id: null`, or a frame this client could not read. */
  | { type: 'server_error'; error: SlabClientError };

export type SlabClientState = 'open' | 'reconnecting' | 'closed';

/** What the server's hello answer said. */
export interface ServerHello {
  credit: number;
  maxFrameBytes: number;
  maxClientBatchSize?: number;
  version?: string;
}

const DEFAULTS = {
  credit: 256,
  maxQueued: 1024,
  timeoutGraceMs: 1000,
  connectTimeoutMs: 10_000,
};

const RECONNECT_DEFAULTS: Required<ReconnectOptions> = {
  initialDelayMs: 100,
  maxDelayMs: 10_000,
  factor: 2,
  jitter: 0.5,
  maxAttempts: Infinity,
};

/** Delay before reconnect attempt `attempt` (1-based): min(max, initial * factor^(attempt-1)), minus up to `jitter` of it at random. */
export function backoffDelay(attempt: number, opts: ReconnectOptions = {}, random: () => number = Math.random): number {
  const o = { ...RECONNECT_DEFAULTS, ...opts };
  const base = Math.min(o.maxDelayMs, o.initialDelayMs * Math.pow(o.factor, Math.max(0, attempt - 1)));
  const jitter = Math.min(1, Math.max(0, o.jitter));
  return Math.round(base * (1 - jitter * random()));
}

/** ws://, wss:// as given; http(s):// becomes ws(s)://, and a bare origin gets /ws. */
export function toWebSocketUrl(url: string | URL): string {
  const u = new URL(String(url));
  if (u.protocol === 'http:') u.protocol = 'ws:';
  else if (u.protocol === 'https:') u.protocol = 'wss:';
  if (u.protocol !== 'ws:' && u.protocol !== 'wss:') throw new TypeError(`not a WebSocket or HTTP URL: ${String(url)}`);
  if (u.pathname === '/' || u.pathname === '') u.pathname = '/ws';
  return u.toString();
}

const now = (): number => performance.now();

interface Connection {
  ws: WebSocketLike;
  hello: ServerHello;
  /** Sent and not yet answered, including requests the caller gave up on (they hold credit until answered). */
  inflight: Map<number, Pending>;
  /** Adopted by the client and not closed. */
  live: boolean;
  /** Resolves when the socket's close event came. */
  closed: Promise<void>;
}

interface Pending {
  id: number;
  op: Op;
  body: WireBody;
  /** The op takes deadline_ms. */
  serverDeadline: boolean;
  decode: (result: unknown) => unknown;
  resolve: (value: never) => void;
  reject: (err: unknown) => void;
  settled: boolean;
  timeoutMs?: number;
  /** Absolute, in performance.now() ms. */
  deadline?: number;
  timer?: ReturnType<typeof setTimeout>;
  signal?: AbortSignal;
  onAbort?: () => void;
  /** The connection it was sent on, while it waits for the answer. */
  conn?: Connection;
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function frameBytes(data: unknown): Uint8Array | null {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  if (Array.isArray(data) && data.every((d) => d instanceof Uint8Array)) {
    // `ws` with binaryType 'fragments'
    const size = data.reduce((n: number, d: Uint8Array) => n + d.byteLength, 0);
    const out = new Uint8Array(size);
    let at = 0;
    for (const d of data as Uint8Array[]) {
      out.set(d, at);
      at += d.byteLength;
    }
    return out;
  }
  return null;
}

/** Whether a constructor is the `ws` package's (an EventEmitter: it takes `{headers}` as its third argument). */
function looksLikeWsPackage(ctor: WebSocketConstructor): boolean {
  const proto = (ctor as { prototype?: Record<string, unknown> }).prototype;
  return typeof proto?.on === 'function' && typeof proto?.addEventListener === 'function';
}

function isNode(): boolean {
  const p = (globalThis as { process?: { versions?: { node?: string } } }).process;
  return typeof p?.versions?.node === 'string';
}

/**
 * The HTTP status of a refused upgrade, where the WebSocket tells it: the `ws`
 * package's error says "Unexpected server response: 401". Browsers (and
 * Node 22's global WebSocket) do not say why a handshake failed: undefined.
 */
function refusedStatus(error: unknown): number | undefined {
  if (error === undefined) return undefined;
  const m = /Unexpected server response: (\d{3})/.exec(messageOf(error));
  return m ? Number(m[1]) : undefined;
}

function messageOf(err: unknown): string {
  if (err instanceof Error) return err.message;
  if (isRecord(err) && typeof err.message === 'string') return err.message;
  if (isRecord(err) && err.error instanceof Error) return err.error.message;
  return String(err);
}

export class SlabClient implements SlabApi {
  readonly url: string;
  private readonly opts: SlabClientOptions;
  private readonly backoff: Required<ReconnectOptions> | null;
  private wsCtor: WebSocketConstructor | undefined;
  private conn: Connection | null = null;
  private readonly queue = new Map<number, Pending>();
  private nextId = 1;
  private _state: SlabClientState = 'reconnecting';
  private reconnecting = false;
  private wake: (() => void) | null = null;
  private closing: Promise<void> | null = null;
  /** Why calls fail once the client is closed. */
  private terminal: SlabClientError | null = null;
  /** The constructor is the `ws` package (it takes headers). */
  private wsIsNodePackage = false;
  private lastHello: ServerHello | null = null;

  private constructor(url: string, opts: SlabClientOptions) {
    this.url = url;
    this.opts = opts;
    this.wsCtor = opts.WebSocket;
    this.backoff = opts.reconnect === false ? null : { ...RECONNECT_DEFAULTS, ...(typeof opts.reconnect === 'object' ? opts.reconnect : {}) };
    const credit = opts.credit ?? DEFAULTS.credit;
    if (!Number.isInteger(credit) || credit < 1) throw new RangeError('credit must be a positive integer');
    if (opts.apiKey !== undefined) checkApiKey(opts.apiKey);
    if (opts.apiKeyTransport !== undefined && opts.apiKeyTransport !== 'header' && opts.apiKeyTransport !== 'protocol') {
      throw new TypeError("apiKeyTransport must be 'header' or 'protocol'");
    }
    if (opts.WebSocket) this.wsIsNodePackage = looksLikeWsPackage(opts.WebSocket);
  }

  /**
   * Opens the socket and exchanges hello. Rejects with SlabConnectionError
   * (SLABSERVE_CONNECTION_FAILED) if the first connection fails: reconnecting
   * applies only to a socket that was once open. An upgrade refused with 401
   * (no key, or a wrong one) rejects with SlabUnauthorizedError.
   * `url`: ws(s)://host:port/ws, or http(s)://host:port (then /ws).
   */
  static async connect(url: string | URL, options: SlabClientOptions = {}): Promise<SlabClient> {
    const client = new SlabClient(toWebSocketUrl(url), options);
    try {
      client.adopt(await client.open(), false);
    } catch (err) {
      client._state = 'closed';
      client.terminal = err instanceof SlabClientError ? err : new SlabConnectionError(messageOf(err), 'SLABSERVE_CONNECTION_FAILED', { cause: err });
      throw client.terminal;
    }
    return client;
  }

  /** The same API over HTTP (fetch), for callers that cannot hold a socket. */
  static http(baseUrl: string | URL, options: SlabHttpClientOptions = {}): SlabHttpClient {
    return new SlabHttpClient(baseUrl, options);
  }

  /** 'open', 'reconnecting' (calls wait), or 'closed' (calls reject). */
  get state(): SlabClientState {
    return this._state;
  }

  /** The last hello answer: granted credit, frame limit, batch limit, server version. */
  get server(): ServerHello | null {
    return this.lastHello;
  }

  /** Requests sent and not yet answered on the current socket (including abandoned ones still holding credit). */
  get inflight(): number {
    return this.conn?.inflight.size ?? 0;
  }

  /** Calls waiting locally for credit or a socket. */
  get queued(): number {
    return this.queue.size;
  }

  embed(inputs: TextInputs | TokenInputs, opts?: EmbedOptions & { embeddingType?: 'float' }): Promise<Float32Array[]>;
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions & { embeddingType: SignedEmbeddingType }): Promise<Int8Array[]>;
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions & { embeddingType: UnsignedEmbeddingType }): Promise<Uint8Array[]>;
  embed(inputs: TextInputs | TokenInputs, opts?: EmbedOptions): Promise<EmbeddingRow[]>;
  embed(inputs: TextInputs | TokenInputs, opts: EmbedOptions = {}): Promise<EmbeddingRow[]> {
    const f32 = (opts.encoding ?? 'f32') === 'f32';
    return this.call('embed', embedBody(inputs, opts, f32), decodeRowsOf(opts.embeddingType), opts, true);
  }

  predict(inputs: string | readonly number[], opts?: PredictOptions): Promise<Prediction[]>;
  predict(inputs: readonly string[] | readonly (readonly number[])[], opts?: PredictOptions): Promise<Prediction[][]>;
  predict(inputs: TextInputs | TokenInputs, opts?: PredictOptions): Promise<Prediction[] | Prediction[][]>;
  predict(inputs: TextInputs | TokenInputs, opts: PredictOptions = {}): Promise<Prediction[] | Prediction[][]> {
    return this.call('predict', predictBody(inputs, opts), decodeList<Prediction[] | Prediction[][]>('predict'), opts, true);
  }

  rerank(query: string, texts: readonly string[], opts: RerankOptions = {}): Promise<RerankHit[]> {
    return this.call('rerank', rerankBody(query, texts, opts), decodeList<RerankHit[]>('rerank'), opts, true);
  }

  similarity(sourceSentence: string, sentences: readonly string[], opts: SimilarityOptions = {}): Promise<number[]> {
    return this.call('similarity', similarityBody(sourceSentence, sentences, opts), decodeScores, opts, true);
  }

  tokenize(inputs: TextInputs, opts: TokenizeOptions = {}): Promise<TokenizeResult> {
    return this.call('tokenize', tokenizeBody(inputs, opts), decodeList<TokenizeResult>('tokenize'), opts, false);
  }

  decode(ids: readonly number[], opts?: DecodeOptions): Promise<string>;
  decode(ids: readonly (readonly number[])[], opts?: DecodeOptions): Promise<string[]>;
  decode(ids: TokenInputs, opts?: DecodeOptions): Promise<string | string[]>;
  decode(ids: TokenInputs, opts: DecodeOptions = {}): Promise<string | string[]> {
    return this.call('decode', decodeBody(ids, opts), decodedTexts(ids), opts, false);
  }

  /**
   * Closes the socket and stops reconnecting. Calls queued or in flight
   * reject with SlabConnectionError (SLABSERVE_CLIENT_CLOSED); the server
   * cancels what the socket had in flight.
   */
  close(): Promise<void> {
    if (this.closing) return this.closing;
    this._state = 'closed';
    this.terminal = new SlabConnectionError('the client was closed', 'SLABSERVE_CLIENT_CLOSED');
    this.wake?.();
    this.failQueued(this.terminal);
    const conn = this.conn;
    this.conn = null;
    if (!conn) return (this.closing = Promise.resolve());
    conn.live = false;
    for (const p of conn.inflight.values()) this.fail(p, this.terminal);
    conn.inflight.clear();
    try {
      conn.ws.close(1000, 'client closed');
    } catch {
      // already closing
    }
    let timer: ReturnType<typeof setTimeout> | undefined;
    const gaveUp = new Promise<void>((res) => {
      timer = setTimeout(() => {
        (conn.ws as { terminate?: () => void }).terminate?.();
        res();
      }, 2000);
    });
    this.closing = Promise.race([conn.closed, gaveUp]).finally(() => clearTimeout(timer));
    return this.closing;
  }

  // ---- calls -------------------------------------------------------------

  private call<T>(op: Op, body: WireBody, decode: (result: unknown) => T, opts: CallOptions, serverDeadline: boolean): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      if (this._state === 'closed') {
        reject(this.terminal ?? new SlabConnectionError('the client is closed', 'SLABSERVE_CLIENT_CLOSED'));
        return;
      }
      const signal = opts.signal;
      if (signal?.aborted) {
        reject(new SlabAbortError(signal.reason));
        return;
      }
      const timeoutMs = opts.timeoutMs ?? this.opts.timeoutMs;
      if (timeoutMs !== undefined && !(timeoutMs > 0)) {
        reject(new RangeError('timeoutMs must be a positive number'));
        return;
      }
      const conn = this.conn;
      const direct = conn !== null && conn.live && this.queue.size === 0 && conn.inflight.size < conn.hello.credit;
      if (!direct && this.queue.size >= (this.opts.maxQueued ?? DEFAULTS.maxQueued)) {
        reject(
          new SlabClientError(`${this.queue.size} calls already wait for credit or a connection (maxQueued)`, {
            type: 'overloaded',
            code: 'SLABSERVE_CLIENT_QUEUE_FULL',
          }),
        );
        return;
      }
      const p: Pending = {
        id: this.nextId++,
        op,
        body,
        serverDeadline,
        decode,
        resolve: resolve as (value: never) => void,
        reject,
        settled: false,
      };
      if (timeoutMs !== undefined) {
        p.timeoutMs = timeoutMs;
        p.deadline = now() + timeoutMs;
      }
      if (signal) {
        p.signal = signal;
        p.onAbort = () => this.abort(p);
        signal.addEventListener('abort', p.onAbort, { once: true });
      }
      if (direct) {
        this.transmit(conn, p);
      } else {
        this.queue.set(p.id, p);
        this.armTimer(p);
      }
    });
  }

  /** Sends `p` on `conn` (credit already checked), or fails it. */
  private transmit(conn: Connection, p: Pending): void {
    const frame: WireBody = { id: p.id, op: p.op, ...p.body };
    if (p.deadline !== undefined) {
      const left = Math.ceil(p.deadline - now());
      if (left <= 0) {
        this.fail(p, clientTimeout(p.timeoutMs!, 'it expired before it could be sent', p.id));
        return;
      }
      if (p.serverDeadline) frame.deadline_ms = left;
    }
    let bytes: Uint8Array;
    try {
      bytes = pack(frame);
    } catch (err) {
      this.fail(p, new SlabClientError(`cannot encode the request: ${messageOf(err)}`, { type: 'validation', code: 'SLABSERVE_CLIENT_ENCODE', cause: err, requestId: p.id }));
      return;
    }
    if (bytes.byteLength > conn.hello.maxFrameBytes) {
      this.fail(
        p,
        new SlabClientError(`the request is ${bytes.byteLength} bytes; the server takes frames of at most ${conn.hello.maxFrameBytes}`, {
          type: 'payload_too_large',
          code: 'SLABSERVE_CLIENT_FRAME_TOO_LARGE',
          requestId: p.id,
        }),
      );
      return;
    }
    try {
      conn.ws.send(bytes);
    } catch (err) {
      this.fail(p, new SlabConnectionError(`cannot send: ${messageOf(err)}`, 'SLABSERVE_CONNECTION_LOST', { cause: err, requestId: p.id }));
      return;
    }
    p.conn = conn;
    conn.inflight.set(p.id, p);
    this.armTimer(p);
  }

  /** Sends what the credit allows from the queue. */
  private pump(): void {
    const conn = this.conn;
    if (!conn || !conn.live) return;
    for (const p of this.queue.values()) {
      if (conn.inflight.size >= conn.hello.credit || !conn.live) break;
      this.queue.delete(p.id);
      if (!p.settled) this.transmit(conn, p);
    }
  }

  /** Queued: fire at the deadline. Sent: at the deadline plus grace (the server answers a timeout itself before). */
  private armTimer(p: Pending): void {
    if (p.timer !== undefined) clearTimeout(p.timer);
    p.timer = undefined;
    if (p.deadline === undefined || p.settled) return;
    const at = p.conn && p.serverDeadline ? p.deadline + (this.opts.timeoutGraceMs ?? DEFAULTS.timeoutGraceMs) : p.deadline;
    p.timer = setTimeout(() => this.onTimer(p), Math.max(0, at - now()));
  }

  private onTimer(p: Pending): void {
    p.timer = undefined;
    if (p.settled) return;
    if (p.conn) {
      this.sendCancel(p.conn, p.id);
      this.fail(p, clientTimeout(p.timeoutMs!, 'the server did not answer by the deadline', p.id)); // holds credit until answered
    } else {
      this.queue.delete(p.id);
      this.fail(p, clientTimeout(p.timeoutMs!, this._state === 'open' ? 'still waiting for credit' : 'still waiting for a connection', p.id));
    }
  }

  private abort(p: Pending): void {
    if (p.settled) return;
    if (p.conn) this.sendCancel(p.conn, p.id); // stays in flight until the server answers (cancelled, or its result)
    else this.queue.delete(p.id);
    this.fail(p, new SlabAbortError(p.signal?.reason, p.id));
  }

  private sendCancel(conn: Connection, id: number): void {
    if (!conn.live) return;
    try {
      conn.ws.send(pack({ op: 'cancel', id }));
    } catch {
      // the socket is going; the server cancels everything it had
    }
  }

  private finish(p: Pending): boolean {
    if (p.settled) return false;
    p.settled = true;
    if (p.timer !== undefined) clearTimeout(p.timer);
    p.timer = undefined;
    if (p.signal && p.onAbort) p.signal.removeEventListener('abort', p.onAbort);
    return true;
  }

  private fail(p: Pending, err: unknown): void {
    if (this.finish(p)) p.reject(err);
  }

  private succeed(p: Pending, value: unknown): void {
    if (this.finish(p)) (p.resolve as (v: unknown) => void)(value);
  }

  private failQueued(err: SlabClientError): void {
    const waiting = [...this.queue.values()];
    this.queue.clear();
    for (const p of waiting) this.fail(p, err);
  }

  // ---- connection --------------------------------------------------------

  private async constructorOf(): Promise<WebSocketConstructor> {
    if (this.wsCtor) return this.wsCtor;
    const global = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    // In Node, the `ws` package wherever it is installed, rather than a global WebSocket (Node 22 on):
    // it takes headers (an API key goes as one) and tells a refused upgrade's status (a 401 is then
    // SlabUnauthorizedError, not retried), where the global one does neither.
    if (global && !isNode()) return (this.wsCtor = global);
    let ctor: WebSocketConstructor | undefined;
    try {
      const name = 'ws'; // not a literal: bundlers for browsers must not try to resolve it
      const mod = (await import(/* @vite-ignore */ name)) as { WebSocket?: WebSocketConstructor; default?: WebSocketConstructor };
      ctor = mod.WebSocket ?? mod.default;
    } catch (err) {
      if (!global) throw err;
    }
    if (ctor) {
      this.wsIsNodePackage = true;
      return (this.wsCtor = ctor);
    }
    if (global) return (this.wsCtor = global);
    throw new Error('no WebSocket: pass options.WebSocket, or install the ws package');
  }

  /** The constructor's arguments: the key as a header, or as a subprotocol beside `slabserve`. */
  private socketArgs(): [string | string[] | undefined, { headers: Record<string, string> } | undefined] {
    const protocols = this.opts.protocols;
    const key = this.opts.apiKey;
    if (key === undefined) return [protocols, undefined];
    const transport = this.opts.apiKeyTransport ?? (this.wsIsNodePackage ? 'header' : 'protocol');
    if (transport === 'header') return [protocols, { headers: { authorization: bearerHeader(key) } }];
    const offered = protocols === undefined ? [] : typeof protocols === 'string' ? [protocols] : [...protocols];
    if (!offered.includes(WS_PROTOCOL)) offered.unshift(WS_PROTOCOL);
    offered.push(wsKeyProtocol(key));
    return [offered, undefined];
  }

  /** Opens a socket and exchanges hello; resolves with the connection, not yet adopted. */
  private async open(): Promise<Connection> {
    let Ctor: WebSocketConstructor;
    try {
      Ctor = await this.constructorOf();
    } catch (err) {
      throw new SlabConnectionError(messageOf(err), 'SLABSERVE_CONNECTION_FAILED', { cause: err });
    }
    const credit = this.opts.credit ?? DEFAULTS.credit;
    const timeoutMs = this.opts.connectTimeoutMs ?? DEFAULTS.connectTimeoutMs;
    return new Promise<Connection>((resolve, reject) => {
      let ws: WebSocketLike;
      try {
        const [protocols, options] = this.socketArgs();
        ws = options ? new Ctor(this.url, protocols, options) : new Ctor(this.url, protocols);
      } catch (err) {
        reject(new SlabConnectionError(`cannot open ${this.url}: ${messageOf(err)}`, 'SLABSERVE_CONNECTION_FAILED', { cause: err }));
        return;
      }
      ws.binaryType = 'arraybuffer';
      let markClosed!: () => void;
      const conn: Connection = {
        ws,
        hello: { credit: 1, maxFrameBytes: Infinity },
        inflight: new Map(),
        live: false,
        closed: new Promise<void>((res) => (markClosed = res)),
      };
      let handshaking = true;
      let lastError: unknown;
      /** Ends the handshake with `why`, or with `typed` as is (an unauthorized error, which must keep its type). */
      const fail = (why: string, cause?: unknown, typed?: SlabClientError) => {
        if (!handshaking) return;
        handshaking = false;
        clearTimeout(timer);
        try {
          ws.close();
        } catch {
          // not open yet
        }
        reject(typed ?? new SlabConnectionError(`cannot connect to ${this.url}: ${why}`, 'SLABSERVE_CONNECTION_FAILED', cause !== undefined ? { cause } : {}));
      };
      const timer = setTimeout(() => fail(`no hello answer within ${timeoutMs} ms`), timeoutMs);
      ws.onopen = () => {
        try {
          ws.send(pack({ op: 'hello', credit }));
        } catch (err) {
          fail(`cannot send hello: ${messageOf(err)}`, err);
        }
      };
      ws.onerror = (event: unknown) => {
        lastError = event;
      };
      ws.onclose = (event: { code: number; reason: string }) => {
        markClosed();
        const status = handshaking ? refusedStatus(lastError) : undefined;
        if (status === 401 || status === 403) {
          // The key is missing or wrong: a typed error, which connect() and the reconnect loop do not retry.
          const why = this.opts.apiKey === undefined ? 'the server needs an API key (options.apiKey)' : 'the API key is not valid';
          fail(why, lastError, new SlabUnauthorizedError(`${this.url} refused the WebSocket upgrade with ${status}: ${why}`, { status, cause: lastError }));
        } else if (handshaking) fail(`the socket closed (code ${event.code}${event.reason ? `: ${event.reason}` : ''})${lastError !== undefined ? `: ${messageOf(lastError)}` : ''}`, lastError);
        else this.onClose(conn, event.code, event.reason);
      };
      ws.onmessage = (event: { data: unknown }) => {
        const msg = this.decodeFrame(event.data);
        if (!handshaking) {
          this.onFrame(conn, msg);
          return;
        }
        if (msg instanceof SlabClientError) {
          fail(msg.message, msg);
        } else if (msg.op === 'hello') {
          const granted = typeof msg.credit === 'number' && msg.credit >= 1 ? Math.floor(msg.credit) : credit;
          conn.hello = {
            credit: Math.min(granted, credit),
            maxFrameBytes: typeof msg.max_frame_bytes === 'number' && msg.max_frame_bytes > 0 ? msg.max_frame_bytes : Infinity,
            ...(typeof msg.max_client_batch_size === 'number' ? { maxClientBatchSize: msg.max_client_batch_size } : {}),
            ...(typeof msg.version === 'string' ? { version: msg.version } : {}),
          };
          handshaking = false;
          clearTimeout(timer);
          resolve(conn);
        } else if (msg.error !== undefined) {
          const err = fromServerError(msg.error);
          fail(`hello refused: ${err.message}`, err, err instanceof SlabUnauthorizedError ? err : undefined);
        }
      };
    });
  }

  private decodeFrame(data: unknown): Record<string, unknown> | SlabClientError {
    const bytes = frameBytes(data);
    if (!bytes) return protocolError(`the server sent a ${typeof data === 'string' ? 'text' : typeof data} frame; expected binary msgpack`);
    try {
      const msg: unknown = unpack(bytes);
      return isRecord(msg) ? msg : protocolError('a frame did not decode to an object');
    } catch (err) {
      return protocolError(`a frame is not msgpack: ${messageOf(err)}`, err);
    }
  }

  private adopt(conn: Connection, reconnected: boolean): void {
    if (this._state === 'closed') {
      try {
        conn.ws.close(1000, 'client closed');
      } catch {
        // ignore
      }
      return;
    }
    conn.live = true;
    this.conn = conn;
    this.lastHello = conn.hello;
    this._state = 'open';
    this.emit({ type: 'open', reconnected, credit: conn.hello.credit });
    this.pump();
  }

  private onFrame(conn: Connection, msg: Record<string, unknown> | SlabClientError): void {
    if (msg instanceof SlabClientError) {
      this.emit({ type: 'server_error', error: msg });
      return;
    }
    if (msg.op === 'hello') return;
    const id = msg.id;
    if (typeof id !== 'number') {
      this.emit({ type: 'server_error', error: msg.error !== undefined ? fromServerError(msg.error) : protocolError(`a frame without a known id: ${JSON.stringify(id)}`) });
      return;
    }
    const p = conn.inflight.get(id);
    if (!p) return; // not ours, or already dropped
    conn.inflight.delete(id);
    p.conn = undefined;
    if (!p.settled) {
      if (msg.error !== undefined && msg.error !== null) {
        this.fail(p, fromServerError(msg.error, id));
      } else if ('result' in msg) {
        let value: unknown;
        let failed: unknown;
        try {
          value = p.decode(msg.result);
        } catch (err) {
          failed = err ?? protocolError('undecodable answer');
        }
        if (failed !== undefined) this.fail(p, failed);
        else this.succeed(p, value);
      } else {
        this.fail(p, protocolError(`the answer to request ${id} has neither result nor error`));
      }
    }
    if (conn.live) this.pump();
  }

  private onClose(conn: Connection, code: number, reason: string): void {
    if (!conn.live) return;
    conn.live = false;
    if (this.conn === conn) this.conn = null;
    const lost = [...conn.inflight.values()].filter((p) => !p.settled);
    conn.inflight.clear();
    this.emit({ type: 'disconnect', code, reason, inflight: lost.length });
    if (this._state === 'closed') return;
    const why = `the connection closed (code ${code}${reason ? `: ${reason}` : ''})`;
    if (this.opts.retryOnReconnect && this.backoff) {
      // Resend first, in their original order, ahead of what was waiting.
      const waiting = [...this.queue.values()];
      this.queue.clear();
      for (const p of lost) {
        p.conn = undefined;
        this.queue.set(p.id, p);
        this.armTimer(p);
      }
      for (const p of waiting) this.queue.set(p.id, p);
    } else {
      for (const p of lost) {
        p.conn = undefined;
        this.fail(p, new SlabConnectionError(`${why} with request ${p.id} in flight; it may or may not have run`, 'SLABSERVE_CONNECTION_LOST', { requestId: p.id }));
      }
    }
    if (this.backoff) {
      void this.reconnectLoop();
    } else {
      this._state = 'closed';
      this.terminal = new SlabConnectionError(`${why} and reconnect is off`, 'SLABSERVE_CONNECTION_FAILED');
      this.failQueued(this.terminal);
    }
  }

  private async reconnectLoop(): Promise<void> {
    if (this.reconnecting || !this.backoff) return;
    this.reconnecting = true;
    this._state = 'reconnecting';
    const backoff = this.backoff;
    let lastError: SlabClientError | undefined;
    for (let attempt = 1; ; attempt++) {
      if (attempt > backoff.maxAttempts) {
        this.reconnecting = false;
        this._state = 'closed';
        this.terminal = new SlabConnectionError(`could not reconnect to ${this.url} in ${backoff.maxAttempts} attempts${lastError ? `: ${lastError.message}` : ''}`, 'SLABSERVE_CONNECTION_FAILED', lastError ? { cause: lastError } : {});
        this.emit({ type: 'gave_up', attempts: backoff.maxAttempts, error: this.terminal });
        this.failQueued(this.terminal);
        return;
      }
      const delayMs = backoffDelay(attempt, backoff);
      this.emit({ type: 'reconnecting', attempt, delayMs });
      await new Promise<void>((res) => {
        const timer = setTimeout(res, delayMs);
        this.wake = () => {
          clearTimeout(timer);
          res();
        };
      });
      this.wake = null;
      if (this.isClosed()) break;
      try {
        const conn = await this.open();
        this.reconnecting = false;
        this.adopt(conn, true);
        return;
      } catch (err) {
        lastError = err instanceof SlabClientError ? err : new SlabConnectionError(messageOf(err), 'SLABSERVE_CONNECTION_FAILED', { cause: err });
        this.emit({ type: 'reconnect_failed', attempt, error: lastError });
        if (this.isClosed()) break;
        if (lastError instanceof SlabUnauthorizedError) {
          // The server no longer takes the key (restarted with other keys): retrying cannot help.
          this.reconnecting = false;
          this._state = 'closed';
          this.terminal = lastError;
          this.emit({ type: 'gave_up', attempts: attempt, error: lastError });
          this.failQueued(lastError);
          return;
        }
      }
    }
    this.reconnecting = false;
  }

  /** A method, not a field read: TypeScript would keep the state narrowed across the awaits above. */
  private isClosed(): boolean {
    return this._state === 'closed';
  }

  private emit(event: SlabClientEvent): void {
    try {
      this.opts.onEvent?.(event);
    } catch {
      // a listener's bug must not break the client
    }
  }
}
