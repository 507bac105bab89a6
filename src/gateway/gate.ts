/**
 * What every request passes before its route runs (docs/security.md), for
 * HTTP routes and the /ws upgrade alike:
 *
 *   1. the request head's size: a URL (path and query) over --max-url-bytes is
 *      answered 414, a head (request line and headers) over --max-header-bytes 431;
 *   2. the gateway's connections: open WebSockets plus HTTP connections with a
 *      request in progress, at most --max-connections; past it, 503 and the
 *      connection closed (slabserve_connections_rejected_total); health and
 *      /metrics are exempt;
 *   3. the API key (--api-key), unless the route is open (health, and /metrics
 *      without --metrics-auth): 401 with WWW-Authenticate: Bearer.
 *
 * It also ends every HTTP request: connection count, access log line.
 *
 * Why connections are counted this way: uWebSockets.js tells JavaScript when a
 * WebSocket opens and closes, but not when an HTTP connection does. An HTTP
 * connection holds at most one request at a time (uWS closes a connection that
 * sends a request before the previous one is answered), so "HTTP connections
 * with a request in progress" is exact; idle keep-alive connections cost a few
 * hundred bytes each and uWS closes them after its idle timeout (10 or 30 s).
 */
import type { GatewayMetrics } from '../shared/telemetry/metrics.js';
import { HttpError } from '../shared/errors.js';
import { RequestContext, type DiscardLimits } from './http/request-context.js';
import type { AccessLog } from './log.js';
import { ApiKeys, type AuthResult } from './security.js';
import type { HttpRequest, HttpResponse } from './uws.js';

export interface GateOptions {
  /** API keys; empty: no authentication (--api-key, --api-key-file). */
  apiKeys: string[];
  /** Keys the 'admin' routes (the model repository's) take instead of the API keys (--admin-api-key); absent or empty: the API keys. */
  adminApiKeys?: string[];
  /** /metrics needs a key too (--metrics-auth). */
  metricsAuth: boolean;
  /** Most connections at once: open WebSockets plus HTTP connections with a request in progress (--max-connections). */
  maxConnections: number;
  /** Longest URL, path and query, in bytes (--max-url-bytes): 414 past it. */
  maxUrlBytes: number;
  /** Largest request head, request line and headers, in bytes (--max-header-bytes): 431 past it. */
  maxHeaderBytes: number;
  /** Most body bytes, in all, read and dropped so that an answer decided before the body arrived is read (--max-discard-bytes; src/gateway/http/request-context.ts DiscardLimits). */
  maxDiscardBytes: number;
  /** How long, at most, that answer waits for the rest of the body (--discard-timeout-ms). */
  discardTimeoutMs: number;
}

/**
 * Who may call a route: anyone ('open'), anyone unless --metrics-auth ('metrics'), key holders
 * (default), or holders of an admin key ('admin': the model repository's routes), which are the API
 * keys unless --admin-api-key names others.
 */
export type RouteAccess = 'open' | 'metrics' | 'key' | 'admin';

export type ConnectionKind = 'http' | 'ws';

export class Gate {
  readonly opts: GateOptions;
  readonly keys: ApiKeys;
  /** The keys of the 'admin' routes: --admin-api-key's, else the API keys. */
  readonly adminKeys: ApiKeys;
  /** HTTP requests in progress (each holds its connection). */
  httpActive = 0;
  /** Open WebSockets. */
  wsOpen = 0;
  private readonly metrics: GatewayMetrics;
  private readonly access: AccessLog;
  /** Told of every request and WebSocket frame (the event-loop delay is measured while there are some). */
  readonly touch: () => void;
  /** Whether the server is draining: every answer then closes its connection (Connection: close). */
  private readonly draining: () => boolean;
  /** What a refusal reads and drops of a body still arriving (RequestObserver). */
  readonly discard: DiscardLimits;

  constructor(opts: GateOptions, metrics: GatewayMetrics, access: AccessLog, hooks: { touch?: () => void; draining?: () => boolean } = {}) {
    this.opts = opts;
    this.keys = new ApiKeys(opts.apiKeys);
    this.adminKeys = opts.adminApiKeys?.length ? new ApiKeys(opts.adminApiKeys) : this.keys;
    this.metrics = metrics;
    this.access = access;
    this.touch = hooks.touch ?? (() => {});
    this.draining = hooks.draining ?? (() => false);
    this.discard = { maxBytes: opts.maxDiscardBytes, timeoutMs: opts.discardTimeoutMs };
  }

  /** Whether an answer must close its connection: while draining, so no client sends another request on it. */
  closesConnection(): boolean {
    return this.draining();
  }

  /** Sets the connection gauge (at scrape time: nothing is counted per request but two integers). */
  updateMetrics(): void {
    this.metrics.connections.set({ kind: 'http' }, this.httpActive);
    this.metrics.connections.set({ kind: 'ws' }, this.wsOpen);
  }

  get connections(): number {
    return this.httpActive + this.wsOpen;
  }

  /**
   * The request head's size against the limits, during the handler's
   * synchronous part (the HttpRequest is gone after it). An error, or null.
   */
  checkHead(req: HttpRequest, method: string, url: string): HttpError | null {
    const query = req.getQuery() ?? '';
    const urlBytes = url.length + (query.length > 0 ? query.length + 1 : 0);
    if (urlBytes > this.opts.maxUrlBytes) {
      return new HttpError(414, 'payload_too_large', 'SLABSERVE_URL_TOO_LONG', `the URL is ${urlBytes} bytes long; at most ${this.opts.maxUrlBytes} (--max-url-bytes)`);
    }
    let head = method.length + urlBytes + 11; // "METHOD URL HTTP/1.1\r\n"
    req.forEach((k, v) => {
      head += k.length + v.length + 4; // "k: v\r\n"
    });
    if (head > this.opts.maxHeaderBytes) {
      return new HttpError(431, 'payload_too_large', 'SLABSERVE_HEADERS_TOO_LARGE', `the request head is ${head} bytes; at most ${this.opts.maxHeaderBytes} (--max-header-bytes)`);
    }
    return null;
  }

  /** 503 for a connection past --max-connections (counted), or null. `kind` is what would be added. */
  checkConnections(kind: ConnectionKind): HttpError | null {
    // An HTTP request is already counted when this is asked; an upgrade is not yet.
    const after = kind === 'http' ? this.connections : this.connections + 1;
    if (after <= this.opts.maxConnections) return null;
    this.metrics.connectionsRejected.inc({ kind });
    return new HttpError(
      503,
      'unavailable',
      'SLABSERVE_TOO_MANY_CONNECTIONS',
      `this gateway already holds ${this.opts.maxConnections} connections (--max-connections); retry shortly`,
      { 'retry-after': '1' },
    );
  }

  /** Whether a route with `access` needs a key. */
  needsKey(access: RouteAccess): boolean {
    if (access === 'admin') return this.adminKeys.enabled;
    if (!this.keys.enabled || access === 'open') return false;
    return access === 'key' || this.opts.metricsAuth;
  }

  /** The API key check of a request with `Authorization: <header>`: null when let in, else the 401. */
  checkKey(access: RouteAccess, authorization: string): HttpError | null {
    if (!this.needsKey(access)) return null;
    return unauthorized((access === 'admin' ? this.adminKeys : this.keys).authorize(authorization));
  }

  /**
   * Everything before an HTTP route runs. Counts the request as a connection;
   * answers and returns false when it may not go on. Health and /metrics are
   * exempt from --max-connections: a saturated gateway must not fail its
   * liveness probe (and be restarted for being busy) nor hide its metrics.
   */
  admit(ctx: RequestContext, req: HttpRequest, access: RouteAccess, fail: (ctx: RequestContext, err: unknown) => void): boolean {
    this.httpActive++;
    this.touch();
    const err =
      this.checkHead(req, ctx.method, ctx.url) ??
      (access === 'key' || access === 'admin' ? this.checkConnections('http') : null) ??
      this.checkKey(access, req.getHeader('authorization'));
    if (err === null) return true;
    this.metrics.failures.inc({ reason: err.type });
    fail(ctx, err);
    return false;
  }

  /** Answers a request the gate refused outside a route (a WebSocket upgrade): our error shape, counted and logged. */
  refuse(res: HttpResponse, req: HttpRequest, err: HttpError, route: string): void {
    this.httpActive++; // finished() takes it back
    const ctx = new RequestContext(res, req, this, route);
    this.metrics.failures.inc({ reason: err.type });
    ctx.fail(err);
  }

  /** Called once per HTTP request, when answered or aborted: frees its connection slot, writes its access line. */
  finished(ctx: RequestContext, status: number): void {
    this.httpActive--;
    if (!this.access.enabled && ctx.internalError === undefined) return;
    this.access.record({
      reqId: ctx.requestId,
      method: ctx.method,
      route: ctx.route,
      path: ctx.url,
      model: ctx.model,
      status,
      ms: performance.now() - ctx.startedAt,
      probe: ctx.probe,
      ...(ctx.errorCode !== undefined ? { code: ctx.errorCode } : {}),
      ...(ctx.internalError !== undefined ? { error: ctx.internalError } : {}),
    });
  }

  wsOpened(): void {
    this.wsOpen++;
  }

  wsClosed(): void {
    this.wsOpen--;
  }
}

/** The 401 for a failed key check. */
export function unauthorized(result: AuthResult): HttpError | null {
  if (result === 'ok') return null;
  const missing = result === 'missing';
  return new HttpError(
    401,
    'unauthorized',
    'SLABSERVE_UNAUTHORIZED',
    missing ? 'this server needs an API key: send it as "Authorization: Bearer <key>"' : 'the API key is not valid',
    { 'www-authenticate': missing ? 'Bearer realm="slabserve"' : 'Bearer realm="slabserve", error="invalid_token"' },
  );
}

