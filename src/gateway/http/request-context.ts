/**
 * HTTP plumbing over uWebSockets.js: a request context that outlives the
 * synchronous handler, body reading with a byte limit, content negotiation
 * (JSON or msgpack), and error responses of one shape:
 * `{"error": message, "error_type": TEI's kind, "type": kind, "code": code}` with the status for the error's type.
 *
 * uWS rules this module hides: the HttpRequest is only valid during the
 * handler's synchronous part (so headers are copied at once); once the client
 * goes away (onAborted) the response must not be touched; writes from a later
 * tick must be corked.
 */
import { DEFAULTS } from '../../shared/options.js';
import { pack } from 'msgpackr';
import { CancelledError, HttpError, OverloadedError, SlabserveError, ValidationError, type ErrorType } from '../../shared/errors.js';
import { Cancellation } from '../../core/cancel.js';
import { STATUS_OF_TYPE } from '../../shared/error-status.js';
import { decodeMsgpack, requestId } from '../security.js';
import type { HttpRequest, HttpResponse } from '../uws.js';

export const MSGPACK = 'application/msgpack';
const MSGPACK_TYPES = new Set([MSGPACK, 'application/x-msgpack', 'application/vnd.msgpack']);

const REASON: Record<number, string> = {
  200: 'OK',
  400: 'Bad Request',
  401: 'Unauthorized',
  404: 'Not Found',
  405: 'Method Not Allowed',
  413: 'Payload Too Large',
  414: 'URI Too Long',
  415: 'Unsupported Media Type',
  422: 'Unprocessable Entity',
  429: 'Too Many Requests',
  431: 'Request Header Fields Too Large',
  499: 'Client Closed Request',
  500: 'Internal Server Error',
  503: 'Service Unavailable',
  504: 'Gateway Timeout',
};

export function statusOf(err: unknown): number {
  if (err instanceof HttpError) return err.status;
  if (err instanceof SlabserveError) return STATUS_OF_TYPE[err.type] ?? 500;
  return 500;
}

/** Told once when a request ends: answered (its status) or abandoned by the client (499). */
export interface RequestObserver {
  finished(ctx: RequestContext, status: number): void;
  /** Whether every answer closes its connection now (the server is draining). */
  closesConnection?(): boolean;
  /** How much of a body still arriving is read and dropped before its answer (default: --max-discard-bytes's and --discard-timeout-ms's). */
  readonly discard?: DiscardLimits;
}

/**
 * An answer decided while its request's body is still arriving (a refusal
 * before the body is read, a 413 past --max-body-bytes) from a client that
 * asked for `Connection: close` (as Python's urllib does) waits for the rest
 * of the body, reading and dropping it, and is written once it has all
 * arrived: uWS closes such a connection as soon as the answer ends, with body
 * bytes unread, which resets it, and a client that writes its whole body
 * before reading sees EPIPE or ECONNRESET, never the answer. Past these bounds
 * the answer is written at once and the connection closed (such a client may
 * see the reset): a body of more than `maxBytes` in all (declared by
 * Content-Length, or a chunked one growing past it), or one not in within
 * `timeoutMs` of the answer. (A client that keeps its connection is answered
 * at once and uWS drops the rest of its body: RequestContext.write.)
 */
export interface DiscardLimits {
  /** --max-discard-bytes */
  maxBytes: number;
  /** --discard-timeout-ms */
  timeoutMs: number;
}


type BodySink = (chunk: ArrayBuffer, isLast: boolean) => void;
/** What becomes of body bytes nobody reads (yet). */
const DROP: BodySink = () => {};

/** An answer body that knows how to serialise itself (JSON text or bytes, msgpack bytes), used at once: the bytes may be a scratch view. */
export interface Answer {
  json(): string | Uint8Array;
  msgpack(): Uint8Array;
}

const NO_HEADERS: Record<string, string> = Object.freeze({}) as Record<string, string>;

/** "200 OK", ... formatted once. */
const STATUS_LINE: Record<number, string> = Object.fromEntries(Object.entries(REASON).map(([k, v]) => [k, `${k} ${v}`]));

/** Statuses after which the connection is closed: the client may still be sending a body nobody reads. */
const CLOSE_AFTER = new Set([413, 414, 431]);

/** Everything a handler needs after its synchronous part: headers copied, abort tracked. */
export class RequestContext {
  readonly res: HttpResponse;
  readonly method: string;
  readonly url: string;
  readonly contentType: string;
  readonly accept: string;
  readonly userAgent: string;
  readonly contentLength: number | undefined;
  /** Raw x-deadline-ms and x-priority headers ('' when absent). */
  private readonly deadlineHeader: string;
  private readonly priorityHeader: string;
  readonly startedAt = performance.now();
  /** W3C trace context headers ('' when absent): a traced request's parent. */
  readonly traceContext: { traceparent: string; tracestate: string };
  /** The client's x-request-id when sane, else a new one; echoed in the x-request-id response header. */
  readonly requestId: string;
  /** The route's pattern (a metrics and log label, never the raw URL). */
  readonly route: string;
  /** The model the request turned out to use, once known (access log). */
  model = 'unknown';
  /** A health probe or metrics scrape (its route says so): no access line unless --log-probes. */
  probe = false;
  /** Our error code, when answered with an error (access log). */
  errorCode: string | undefined;
  /** An unexpected error's message and stack: logged, never sent. */
  internalError: string | undefined;
  private readonly observer: RequestObserver | undefined;
  /** Cancelled when the client disconnects: a body read in progress fails, the request's slots are cancelled. */
  readonly cancel = new Cancellation();
  private done = false;
  /** Body bytes may still arrive: a Content-Length or chunked body not read to its end. */
  private bodyPending: boolean;
  /** The client sent `Connection: close` with a body: uWS closes the connection when the answer ends (DiscardLimits). */
  private readonly closesAfterAnswer: boolean;
  /** Body bytes arrived so far. */
  private bodyBytes = 0;
  /** Where arriving body chunks go: readPayload's reader, or dropped. */
  private sink: BodySink = DROP;
  private listening = false;
  /** An answer written once the body has arrived (DiscardLimits): its bound's timer, until then. */
  private held: ReturnType<typeof setTimeout> | undefined;

  constructor(res: HttpResponse, req: HttpRequest, observer?: RequestObserver, route = '') {
    this.res = res;
    this.observer = observer;
    this.route = route;
    this.requestId = requestId(req.getHeader('x-request-id'));
    this.method = req.getCaseSensitiveMethod?.() ?? req.getMethod().toUpperCase();
    this.url = req.getUrl();
    const type = req.getHeader('content-type');
    this.contentType = type === 'application/json' ? type : type.split(';')[0]!.trim().toLowerCase();
    this.accept = req.getHeader('accept');
    this.userAgent = req.getHeader('user-agent');
    const cl = req.getHeader('content-length');
    this.contentLength = cl === '' ? undefined : Number(cl);
    this.bodyPending = cl === '' ? req.getHeader('transfer-encoding') !== '' : this.contentLength! > 0;
    this.deadlineHeader = req.getHeader('x-deadline-ms');
    this.priorityHeader = req.getHeader('x-priority');
    this.traceContext = { traceparent: req.getHeader('traceparent'), tracestate: req.getHeader('tracestate') };
    this.closesAfterAnswer = this.bodyPending && /\bclose\b/i.test(req.getHeader('connection'));
    // From the start: chunks uWS gets before a handler is set are lost, and with them the end of the body.
    if (this.closesAfterAnswer) this.readBody(DROP);
    res.onAborted(() => {
      if (this.held !== undefined) {
        clearTimeout(this.held);
        this.held = undefined;
        this.observer?.finished(this, 499); // gone before its answer, which waited for the body
      }
      if (this.done) return;
      this.done = true;
      this.cancel.cancel('client_disconnect');
      this.observer?.finished(this, 499);
    });
  }

  get finished(): boolean {
    return this.done;
  }

  /** Sends the body's chunks to `sink` from now on. */
  private readBody(sink: BodySink): void {
    this.sink = sink;
    if (this.listening) return;
    this.listening = true;
    this.res.onData((chunk, isLast) => {
      this.bodyBytes += chunk.byteLength;
      if (isLast) this.bodyPending = false;
      this.sink(chunk, isLast);
    });
  }

  /** The request's deadline (x-deadline-ms: ms from now) and priority class (x-priority), when sent. */
  scheduling(): { timeoutMs?: number; priority?: string } {
    const out: { timeoutMs?: number; priority?: string } = {};
    if (this.deadlineHeader !== '') {
      const ms = Number(this.deadlineHeader);
      if (!Number.isFinite(ms) || ms <= 0) throw new ValidationError(`x-deadline-ms must be a positive number of milliseconds, got "${this.deadlineHeader}"`);
      out.timeoutMs = ms;
    }
    if (this.priorityHeader !== '') out.priority = this.priorityHeader.trim().toLowerCase();
    return out;
  }

  /** Whether the client asked for msgpack back. */
  get wantsMsgpack(): boolean {
    const a = this.accept;
    if (a === '' || a === '*/*' || a === 'application/json') return false;
    const lower = a.toLowerCase();
    return lower.includes(MSGPACK) || lower.includes('application/x-msgpack');
  }

  /**
   * Reads the whole body, at most `limit` bytes, and parses it as JSON or
   * msgpack by Content-Type. A declared Content-Length over the limit is
   * refused before a byte is read; a body that grows past it is refused as
   * soon as it does. Must be called during the route handler's synchronous
   * part: uWS drops body chunks that arrive before onData is attached.
   */
  readPayload(limit: number, opts: { emptyOk?: boolean } = {}): Promise<unknown> {
    const type = this.contentType;
    const isMsgpack = type !== 'application/json' && MSGPACK_TYPES.has(type);
    if (!isMsgpack && type !== '' && type !== 'application/json') {
      return Promise.reject(
        new HttpError(415, 'unsupported_media_type', 'SLABSERVE_UNSUPPORTED_MEDIA_TYPE', `unsupported Content-Type "${type}": send application/json or ${MSGPACK}`),
      );
    }
    if (this.contentLength !== undefined && this.contentLength > limit) {
      return Promise.reject(payloadTooLarge(this.contentLength, limit));
    }
    return new Promise((resolve, reject) => {
      const onCancel = () => reject(new CancelledError('the client went away while sending its body'));
      this.cancel.listen(onCancel);
      let chunks: Buffer[] | null = null;
      let size = 0;
      let refused = false;
      this.readBody((chunk, isLast) => {
        if (refused) return;
        size += chunk.byteLength;
        if (size > limit) {
          refused = true;
          this.cancel.unlisten(onCancel);
          reject(payloadTooLarge(size, limit));
          return;
        }
        if (isLast && size === 0 && opts.emptyOk) {
          this.cancel.unlisten(onCancel);
          resolve(undefined); // no body: the route's defaults
          return;
        }
        if (isLast && chunks === null && !isMsgpack) {
          // The whole body in one chunk, parsed before uWS reuses its memory: no copy (the usual case).
          this.cancel.unlisten(onCancel);
          settle(resolve, reject, () => parseBody(Buffer.from(chunk), false));
          return;
        }
        // uWS reuses the chunk's memory after this call: copy it (msgpack values may point into it).
        (chunks ??= []).push(Buffer.from(chunk.slice(0)));
        if (!isLast) return;
        this.cancel.unlisten(onCancel);
        const all = chunks;
        settle(resolve, reject, () => parseBody(all.length === 1 ? all[0]! : Buffer.concat(all, size), isMsgpack));
      });
    });
  }

  /** Sends `payload` as JSON or msgpack (per Accept), with extra headers. No-op if the client is gone. */
  send(status: number, payload: unknown, headers: Record<string, string> = NO_HEADERS): void {
    const msgpack = this.wantsMsgpack;
    const body = msgpack ? pack(payload) : JSON.stringify(payload);
    this.write(status, msgpack ? MSGPACK : 'application/json', body, headers);
  }

  /** Sends an answer that serialises itself (the hot routes' rows, without a general serialiser). */
  answer(status: number, answer: Answer, headers: Record<string, string> = NO_HEADERS): void {
    if (this.done) return;
    const msgpack = this.wantsMsgpack;
    this.write(status, msgpack ? MSGPACK : 'application/json', msgpack ? answer.msgpack() : answer.json(), headers);
  }

  /**
   * Sends a body as is; `closeConnection` (or a draining server) closes the
   * connection after it. While the client may still be sending its body, the
   * answer says Connection: close but the close is left to the client, which
   * reads the answer and then closes: closing at once (uWS's end(body, true))
   * resets a connection with unread bytes, and a client still writing sees
   * EPIPE or ECONNRESET instead of the answer. uWS reads and drops the rest of
   * the declared body, and its idle timeout (10 s, or 30 s on uWS 20.57) closes a client that stops
   * sending without closing. (uWS cannot close a connection whose response
   * has ended, and one left unended cannot be closed without cutting the
   * answer short: so the bound is the body's own length and that timeout.)
   * A client that sent `Connection: close` is closed by uWS when the answer
   * ends whatever we ask: its answer waits for the body (DiscardLimits).
   */
  write(status: number, contentType: string, body: string | Uint8Array, headers: Record<string, string> = NO_HEADERS, closeConnection = false): void {
    if (this.done) return;
    this.done = true;
    closeConnection ||= this.observer?.closesConnection?.() === true;
    const end = (close: boolean) => {
      const clientCloses = close && this.bodyPending;
      this.res.cork(() => {
        this.res.writeStatus(STATUS_LINE[status] ?? String(status));
        this.res.writeHeader('content-type', contentType);
        this.res.writeHeader('x-request-id', this.requestId);
        for (const k in headers) this.res.writeHeader(k, headers[k]!);
        if (clientCloses) this.res.writeHeader('connection', 'close');
        this.res.end(body, close && !clientCloses);
      });
      this.observer?.finished(this, status);
    };
    if (this.bodyPending && this.closesAfterAnswer) this.dropBodyThen(end, closeConnection);
    else end(closeConnection);
  }

  /** Calls `end(close)` once the rest of the body has arrived and been dropped; past DiscardLimits, `end` at once (uWS closes the connection). */
  private dropBodyThen(end: (close: boolean) => void, close: boolean): void {
    const { maxBytes, timeoutMs } = this.observer?.discard ?? { maxBytes: DEFAULTS.maxDiscardBytes, timeoutMs: DEFAULTS.discardTimeoutMs };
    const tooLarge = () => (this.contentLength ?? this.bodyBytes) > maxBytes;
    if (tooLarge()) return end(close);
    const release = () => {
      clearTimeout(this.held);
      this.held = undefined;
      this.sink = DROP;
      end(close);
    };
    this.held = setTimeout(release, timeoutMs);
    this.readBody((_chunk, isLast) => {
      if (isLast || tooLarge()) release();
    });
  }

  /**
   * Answers an error: its status (or `status(info)`), Retry-After on overload,
   * an HttpError's own headers (Allow), and the connection closed after a
   * refused body (once the rest of it is dropped: write). The body is ours,
   * `{error, error_type, type, code}`, unless `shape` gives another protocol's (OpenAI's, KServe's).
   * Returns the status it answered with (or would have, had the client stayed).
   */
  fail(err: unknown, shape: (info: ErrorInfo) => unknown = ourErrorShape, status?: (info: ErrorInfo) => number): number {
    const info = errorInfo(err);
    const code = status ? status(info) : info.status;
    if (this.done) return code;
    const headers: Record<string, string> = err instanceof HttpError ? { ...err.headers } : {};
    if (err instanceof OverloadedError) headers['retry-after'] = String(Math.max(1, Math.ceil(err.retryAfterSeconds)));
    this.errorCode = info.code;
    if (!(err instanceof SlabserveError)) this.internalError = err instanceof Error ? (err.stack ?? err.message) : String(err);
    const body = shape(info);
    const msgpack = this.wantsMsgpack;
    const close = CLOSE_AFTER.has(info.status) || info.code === 'SLABSERVE_TOO_MANY_CONNECTIONS';
    this.write(code, msgpack ? MSGPACK : 'application/json', msgpack ? pack(body) : JSON.stringify(body), headers, close);
    return code;
  }
}

/** Resolves with `f()`, or rejects with what it throws. */
function settle<T>(resolve: (v: T) => void, reject: (e: unknown) => void, f: () => T): void {
  let v: T;
  try {
    v = f();
  } catch (err) {
    reject(err);
    return;
  }
  resolve(v);
}

/**
 * A request body as JSON or msgpack. JSON.parse makes "__proto__" an own
 * property (never a prototype), msgpack decoding renames it; every route then
 * reads the body through its schema, which copies only the fields it knows.
 */
function parseBody(body: Buffer, isMsgpack: boolean): unknown {
  if (body.length === 0) throw new HttpError(400, 'validation', 'SLABSERVE_MALFORMED_BODY', 'the request body is empty');
  try {
    return isMsgpack ? decodeMsgpack(body) : JSON.parse(body.toString('utf8'));
  } catch (err) {
    throw new HttpError(400, 'validation', 'SLABSERVE_MALFORMED_BODY', `the body is not valid ${isMsgpack ? 'msgpack' : 'JSON'}: ${(err as Error).message}`);
  }
}

/** What an error response needs, whatever its body's shape. */
export interface ErrorInfo {
  status: number;
  message: string;
  /** Our error family (validation, not_found, overloaded, ...). */
  type: string;
  /** Our stable code (SLABSERVE_...). */
  code: string;
  err: unknown;
}

/** Our status, message, family and code for any error (an unexpected one is a 500 'internal error'). */
export function errorInfo(err: unknown): ErrorInfo {
  const e = err instanceof SlabserveError ? err : null;
  return { status: statusOf(err), message: e ? e.message : 'internal error', type: e ? e.type : 'backend', code: e ? e.code : 'SLABSERVE_INTERNAL', err };
}

/** The status of the APIs that answer every invalid request with 400 (OpenAI's, Cohere's, vLLM's): our 422s, and a too-long input's 413. */
export function badRequestStatus(info: ErrorInfo): number {
  if (info.type === 'validation' && info.status === 422) return 400;
  if (info.code === 'SLABSERVE_INPUT_TOO_LONG') return 400;
  return info.status;
}

/**
 * text-embeddings-inference's `error_type` for each of our families: TEI answers errors as
 * `{"error", "error_type"}` with one of Unhealthy, Backend, Overloaded, Validation, Tokenizer,
 * Empty (router/src/lib.rs), and its clients (Haystack's TEI ranker and embedders) read it.
 * A refusal for load or time is Overloaded, not ready Unhealthy, our failures Backend, and every
 * other client error Validation.
 */
export const TEI_ERROR_TYPE: Readonly<Record<ErrorType, 'Unhealthy' | 'Backend' | 'Overloaded' | 'Validation'>> = {
  validation: 'Validation',
  too_long: 'Validation',
  payload_too_large: 'Validation',
  not_found: 'Validation',
  method_not_allowed: 'Validation',
  unsupported_media_type: 'Validation',
  unauthorized: 'Validation',
  unsupported_output: 'Validation',
  overloaded: 'Overloaded',
  timeout: 'Overloaded',
  unavailable: 'Unhealthy',
  cancelled: 'Backend',
  backend: 'Backend',
};

/** Our error body: TEI's `{error, error_type}` with our family (`type`) and stable code. */
const ourErrorShape = (info: ErrorInfo) => ({ error: info.message, error_type: TEI_ERROR_TYPE[info.type as ErrorType] ?? 'Backend', type: info.type, code: info.code });

function payloadTooLarge(size: number, limit: number): HttpError {
  return new HttpError(413, 'payload_too_large', 'SLABSERVE_PAYLOAD_TOO_LARGE', `request body of ${size} bytes exceeds the limit of ${limit} (--max-body-bytes)`);
}
