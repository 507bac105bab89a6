/**
 * Errors of the slabserve client, the same over WebSocket and HTTP.
 *
 * A server error (an `{id, error: {type, code, message}}` frame, or an HTTP
 * error answer `{error, type, code}` with its status and Retry-After) becomes
 * a SlabClientError with the server's `type` and `code`. Failures of the
 * client itself have their own codes:
 *
 *   SlabConnectionError  type 'connection'  SLABSERVE_CONNECTION_LOST     socket dropped with the request in flight (it may or may not have run)
 *                                           SLABSERVE_CONNECTION_FAILED   could not connect (or reconnect), network error over HTTP
 *                                           SLABSERVE_CLIENT_CLOSED       close() was called
 *   SlabAbortError       type 'cancelled'   SLABSERVE_ABORTED             the caller's AbortSignal fired
 *   SlabUnauthorizedError type 'unauthorized' SLABSERVE_UNAUTHORIZED      the server wants an API key and none or a wrong one was sent:
 *                                           an HTTP 401 (or 403), or a /ws upgrade refused with one (never retried)
 *   SlabClientError      type 'timeout'     SLABSERVE_CLIENT_TIMEOUT      timeoutMs passed on the client's side (not sent yet, or no answer)
 *                        type 'overloaded'  SLABSERVE_CLIENT_QUEUE_FULL   more than maxQueued requests waiting for credit or a socket
 *                        type 'payload_too_large' SLABSERVE_CLIENT_FRAME_TOO_LARGE  the request exceeds the server's max_frame_bytes
 *                        type 'protocol'    SLABSERVE_PROTOCOL            the server sent something this client cannot read
 *
 * Kept free of server code (type-only imports) so browser bundles stay small.
 */
import { STATUS_OF_TYPE } from '../shared/error-status.js';
import type { ErrorType } from '../shared/errors.js';

/** The server's error families plus the client's own. */
export type ClientErrorType = ErrorType | 'connection' | 'protocol';

export interface SlabClientErrorInit {
  type: ClientErrorType;
  code: string;
  /** HTTP status of the answer (the WebSocket client: the status the same error has over HTTP). */
  status?: number;
  /** Seconds to wait before retrying (from Retry-After, or a `retry_after` in an error frame). */
  retryAfterSeconds?: number;
  /** The request's id on the socket (WebSocket client only). */
  requestId?: string | number;
  cause?: unknown;
}

export class SlabClientError extends Error {
  readonly type: ClientErrorType;
  readonly code: string;
  readonly status?: number;
  readonly retryAfterSeconds?: number;
  readonly requestId?: string | number;

  constructor(message: string, init: SlabClientErrorInit) {
    super(message, init.cause !== undefined ? { cause: init.cause } : undefined);
    this.name = new.target.name;
    this.type = init.type;
    this.code = init.code;
    if (init.status !== undefined) this.status = init.status;
    if (init.retryAfterSeconds !== undefined) this.retryAfterSeconds = init.retryAfterSeconds;
    if (init.requestId !== undefined) this.requestId = init.requestId;
  }

  /** Whether sending the same request again later may succeed (overloaded, unavailable, timeout, connection). */
  get retryable(): boolean {
    return this.type === 'overloaded' || this.type === 'unavailable' || this.type === 'timeout' || this.type === 'connection';
  }
}

/** The connection failed, dropped with the request in flight, or the client was closed. */
export class SlabConnectionError extends SlabClientError {
  constructor(message: string, code: 'SLABSERVE_CONNECTION_LOST' | 'SLABSERVE_CONNECTION_FAILED' | 'SLABSERVE_CLIENT_CLOSED', extra: { cause?: unknown; requestId?: string | number } = {}) {
    super(message, { type: 'connection', code, ...extra });
  }
}

/** The caller's AbortSignal fired; `cause` is the signal's reason. Named AbortError, as fetch's. */
export class SlabAbortError extends SlabClientError {
  constructor(reason?: unknown, requestId?: string | number) {
    super('the request was aborted', { type: 'cancelled', code: 'SLABSERVE_ABORTED', ...(reason !== undefined ? { cause: reason } : {}), ...(requestId !== undefined ? { requestId } : {}) });
    this.name = 'AbortError';
  }
}

/**
 * The server refused the API key (none sent, or not a valid one): HTTP 401
 * (or 403 from a proxy), or a /ws upgrade refused with 401. Sending the same
 * request again cannot succeed; the WebSocket client does not reconnect after it.
 */
export class SlabUnauthorizedError extends SlabClientError {
  constructor(message: string, extra: { code?: string; status?: number; requestId?: string | number; cause?: unknown } = {}) {
    const { code = 'SLABSERVE_UNAUTHORIZED', ...rest } = extra;
    super(message, { type: 'unauthorized', code, ...rest });
  }
}

const SERVER_TYPES = new Set<string>([
  'validation',
  'too_long',
  'not_found',
  'overloaded',
  'timeout',
  'cancelled',
  'backend',
  'unavailable',
  'payload_too_large',
  'unsupported_media_type',
  'unsupported_output',
  'method_not_allowed',
  'unauthorized',
]);

/** The error family of an HTTP status, for answers whose body names none. */
export function typeOfStatus(status: number): ClientErrorType {
  switch (status) {
    case 400:
    case 422:
      return 'validation';
    case 401:
    case 403:
      return 'unauthorized';
    case 404:
      return 'not_found';
    case 405:
      return 'method_not_allowed';
    case 413:
      return 'payload_too_large';
    case 415:
      return 'unsupported_media_type';
    case 408:
    case 504:
      return 'timeout';
    case 424:
      return 'unsupported_output';
    case 429:
      return 'overloaded';
    case 499:
      return 'cancelled';
    case 502:
    case 503:
      return 'unavailable';
    default:
      return status >= 500 ? 'backend' : 'validation';
  }
}

function isRecord(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function retryAfterOf(v: unknown): number | undefined {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined;
}

/** Maps the `error` object of a WebSocket error frame. */
export function fromServerError(error: unknown, requestId?: string | number): SlabClientError {
  const e = isRecord(error) ? error : {};
  const type = typeof e.type === 'string' && SERVER_TYPES.has(e.type) ? (e.type as ErrorType) : 'backend';
  const code = typeof e.code === 'string' ? e.code : 'SLABSERVE_INTERNAL';
  const message = typeof e.message === 'string' ? e.message : typeof error === 'string' ? error : 'the server answered with an error';
  const retryAfterSeconds = retryAfterOf(e.retry_after) ?? retryAfterOf(e.retryAfterSeconds);
  // The status the same error has over HTTP: a caller can handle both clients' errors alike.
  const status = STATUS_OF_TYPE[type];
  if (type === 'unauthorized') return new SlabUnauthorizedError(message, { code, status, ...(requestId !== undefined ? { requestId } : {}) });
  return new SlabClientError(message, {
    type,
    code,
    status,
    ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}),
    ...(requestId !== undefined ? { requestId } : {}),
  });
}

/** Parses Retry-After: delta-seconds or an HTTP date. */
export function parseRetryAfter(header: string | null | undefined, now = Date.now()): number | undefined {
  if (header == null || header.trim() === '') return undefined;
  const s = header.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Number(s);
  const t = Date.parse(s);
  return Number.isNaN(t) ? undefined : Math.max(0, Math.ceil((t - now) / 1000));
}

/** Maps an HTTP error answer: its status, its decoded body (`{error, type, code}` or anything else) and Retry-After. */
export function fromHttpError(status: number, body: unknown, retryAfter: string | null | undefined): SlabClientError {
  const b = isRecord(body) ? body : {};
  const type = typeof b.type === 'string' && SERVER_TYPES.has(b.type) ? (b.type as ErrorType) : typeOfStatus(status);
  const code = typeof b.code === 'string' ? b.code : `SLABSERVE_HTTP_${status}`;
  const message =
    typeof b.error === 'string' ? b.error : typeof b.message === 'string' ? b.message : typeof body === 'string' && body !== '' ? body.slice(0, 500) : `HTTP ${status}`;
  const retryAfterSeconds = parseRetryAfter(retryAfter);
  if (type === 'unauthorized') return new SlabUnauthorizedError(message, { code, status });
  return new SlabClientError(message, { type, code, status, ...(retryAfterSeconds !== undefined ? { retryAfterSeconds } : {}) });
}

export function clientTimeout(timeoutMs: number, where: string, requestId?: string | number): SlabClientError {
  return new SlabClientError(`no answer within ${timeoutMs} ms (${where})`, {
    type: 'timeout',
    code: 'SLABSERVE_CLIENT_TIMEOUT',
    ...(requestId !== undefined ? { requestId } : {}),
  });
}

export function protocolError(message: string, cause?: unknown): SlabClientError {
  return new SlabClientError(message, { type: 'protocol', code: 'SLABSERVE_PROTOCOL', ...(cause !== undefined ? { cause } : {}) });
}
