/**
 * The WebSocket API (`/ws`, docs/websocket.md): many requests in flight on
 * one socket, each answered as soon as its batch completes, matched by id.
 *
 * Per socket the server keeps the requests in flight (an AbortController
 * each, so cancel and close free their slots) and a bounded list of frames
 * held back while the socket's send buffer is over the limit. Nothing grows
 * without bound whatever a client sends: past the credit a request is
 * refused at once; past the credit in held frames the socket is closed.
 *
 * The upgrade passes the gate first (gate.ts): the request head's size, the
 * gateway's connections (an open socket is one) and, with API keys, a key in
 * the Authorization header or in a `bearer.<base64url(key)>` subprotocol
 * (browsers cannot set headers on a WebSocket). A refused upgrade is an
 * ordinary HTTP answer (401, 414, 431, 503) in our error shape.
 */
import { pack } from 'msgpackr';
import { Cancellation } from '../../core/cancel.js';
import { CancelledError, NotReadyError, OverloadedError, SlabserveError, ValidationError } from '../../shared/errors.js';
import type { GatewayMetrics } from '../../shared/telemetry/metrics.js';
import { unauthorized, type Gate } from '../gate.js';
import { statusOf } from '../http/request-context.js';
import type { Infer } from '../../core/infer.js';
import type { AccessLog } from '../log.js';
import { chooseProtocol, decodeMsgpack, requestId, shown } from '../security.js';
import { errorCode, isAnswer, metricsOf, runEndpoint, type Endpoint, type EndpointContext, type GatewayLimits, type Served } from '../serving.js';
import type { RequestSpan, RequestTracing } from '../request-trace.js';
import { nowMs } from '../../shared/clock.js';
import { TEI_ENDPOINTS, TEI_LOCAL_ENDPOINTS } from '../tei/endpoints.js';
import type { HttpRequest, HttpResponse, TemplatedApp, us_socket_context_t, WebSocket } from '../uws.js';

/** The WebSocket API's limits (--ws-max-inflight, --ws-max-buffered-bytes, --ws-max-frame-bytes, --ws-idle-timeout-s). */
export interface WsOptions {
  /** Most requests in flight per socket (and the highest credit a client may ask for). */
  maxInflight: number;
  /** Unsent bytes above which the socket's requests are held back until it drains. */
  maxBufferedBytes: number;
  /** Largest frame accepted; a larger one closes the socket (1009). */
  maxFrameBytes: number;
  /** Seconds without traffic before the socket is closed (uWS sends pings meanwhile). */
  idleTimeoutSeconds: number;
}

export interface WsDeps {
  infer: Infer;
  limits: GatewayLimits;
  metrics: GatewayMetrics;
  ready(): boolean;
  version: string;
  /** Head size, connections and API key, checked at the upgrade. */
  gate: Gate;
  /** One line per request (op) answered. */
  log: AccessLog;
  /** Lazy loading (EndpointContext.loadModel); absent: off. */
  loadModel?: EndpointContext['loadModel'];
  /** Tracing on: a span per request op, its parent from the frame's traceparent (request-trace.ts). */
  tracing?: RequestTracing | undefined;
}

type RequestId = string | number;

interface SocketState {
  /** The upgrade's x-request-id (or a new one): every access line of the socket carries it. */
  reqId: string;
  credit: number;
  inflight: Map<RequestId, Cancellation>;
  /** Frames received while held back (copies: uWS reuses the message memory). */
  held: ArrayBuffer[];
  /** A drain has scheduled taking up the held frames. */
  resuming: boolean;
  closed: boolean;
}

const CODE_TRY_AGAIN_LATER = 1013;
const CODE_MESSAGE_TOO_BIG = 1009;

/** Removes the held (not yet parsed) frame of request `id`, if there is one. */
function dropHeld(state: SocketState, id: RequestId): boolean {
  const i = state.held.findIndex((frame) => {
    try {
      return (decodeMsgpack(new Uint8Array(frame)) as { id?: unknown } | null)?.id === id;
    } catch {
      return false;
    }
  });
  if (i < 0) return false;
  state.held.splice(i, 1);
  return true;
}

function isCancel(frame: ArrayBuffer): boolean {
  try {
    return (decodeMsgpack(new Uint8Array(frame)) as { op?: unknown } | null)?.op === 'cancel';
  } catch {
    return false;
  }
}

/** Registers /ws; returns a function that closes every open socket (code 1001) for shutdown. */
export function registerWebSocket(app: TemplatedApp, deps: WsDeps, opts: WsOptions): () => void {
  const api = new WsApi(deps, opts);
  app.ws<SocketState>('/ws', {
    // uWS drops a connection over its own limit without a close frame: keep that limit above ours,
    // so a frame over --ws-max-frame-bytes gets a proper 1009 close (frames over twice it are dropped).
    maxPayloadLength: opts.maxFrameBytes * 2,
    idleTimeout: opts.idleTimeoutSeconds,
    sendPingsAutomatically: true,
    // We hold requests back at maxBufferedBytes ourselves; uWS must never drop a result.
    maxBackpressure: Math.max(64 * 1024 * 1024, opts.maxBufferedBytes * 16),
    closeOnBackpressureLimit: false,
    upgrade: (res, req, context) => api.upgrade(res, req, context),
    open: (ws) => api.opened(ws),
    message: (ws, message, isBinary) => api.message(ws, message, isBinary),
    drain: (ws) => api.drained(ws),
    close: (ws) => api.closed(ws),
  });
  return () => api.closeAll();
}

/** The protocol of every socket of one gateway: frames in, answers out (docs/websocket.md). */
class WsApi {
  private readonly deps: WsDeps;
  private readonly opts: WsOptions;
  private readonly open = new Set<WebSocket<SocketState>>();
  private readonly opNames = [...TEI_ENDPOINTS.keys(), ...TEI_LOCAL_ENDPOINTS.keys()];

  constructor(deps: WsDeps, opts: WsOptions) {
    this.deps = deps;
    this.opts = opts;
  }

  // ------------------------------------------------------------ the socket's life (uWS's callbacks)

  /** The upgrade passes the gate (head size, connections, API key), or is answered as an HTTP error. */
  upgrade(res: HttpResponse, req: HttpRequest, context: us_socket_context_t): void {
    const gate = this.deps.gate;
    const protocols = req.getHeader('sec-websocket-protocol');
    const refused =
      gate.checkHead(req, 'GET', req.getUrl()) ??
      gate.checkConnections('ws') ??
      (gate.needsKey('key') ? unauthorized(gate.keys.authorizeUpgrade(req.getHeader('authorization'), protocols)) : null);
    if (refused) {
      gate.refuse(res, req, refused, '/ws');
      return;
    }
    const state: SocketState = {
      reqId: requestId(req.getHeader('x-request-id')),
      credit: this.opts.maxInflight,
      inflight: new Map(),
      held: [],
      resuming: false,
      closed: false,
    };
    // Answer one subprotocol the client offered, never the one carrying its key.
    res.upgrade(state, req.getHeader('sec-websocket-key'), chooseProtocol(protocols), req.getHeader('sec-websocket-extensions'), context);
  }

  opened(ws: WebSocket<SocketState>): void {
    this.open.add(ws);
    this.deps.gate.wsOpened();
  }

  message(ws: WebSocket<SocketState>, message: ArrayBuffer, isBinary: boolean): void {
    this.deps.gate.touch();
    const state = ws.getUserData();
    if (message.byteLength > this.opts.maxFrameBytes) {
      state.closed = true;
      ws.end(CODE_MESSAGE_TOO_BIG, `frame of ${message.byteLength} bytes exceeds --ws-max-frame-bytes (${this.opts.maxFrameBytes})`);
      return;
    }
    if (!isBinary) {
      this.sendError(ws, null, new ValidationError('send binary msgpack frames; text frames are not read'));
      return;
    }
    if (state.held.length > 0 || this.heldBack(ws)) {
      // A cancel only frees work: take it at once, even while held back.
      if (message.byteLength <= 64 && isCancel(message)) {
        this.handle(ws, message);
        return;
      }
      // Back-pressure: keep the frame unparsed until the socket drains.
      if (state.held.length >= state.credit) {
        state.closed = true;
        ws.end(CODE_TRY_AGAIN_LATER, 'too many frames while the socket is backed up; read your answers');
        return;
      }
      state.held.push(message.slice(0));
      return;
    }
    this.handle(ws, message);
  }

  drained(ws: WebSocket<SocketState>): void {
    // Not from inside uWS's drain callback: a send made there can stay in uWS's buffer with no
    // further drain to flush it, and the socket would hang. Take held frames up on the next turn.
    const state = ws.getUserData();
    if (state.held.length === 0 || state.resuming) return;
    state.resuming = true;
    setImmediate(() => {
      state.resuming = false;
      if (state.closed) return;
      ws.cork(() => {
        while (state.held.length > 0 && !this.heldBack(ws) && !state.closed) this.handle(ws, state.held.shift()!);
      });
    });
  }

  closed(ws: WebSocket<SocketState>): void {
    this.open.delete(ws);
    this.deps.gate.wsClosed();
    const state = ws.getUserData();
    state.closed = true;
    state.held.length = 0;
    for (const cancel of state.inflight.values()) cancel.cancel('ws_close'); // frees every slot of a client that is gone
    state.inflight.clear();
  }

  /** Shutdown: every open socket closed with 1001. */
  closeAll(): void {
    for (const ws of [...this.open]) {
      ws.getUserData().closed = true;
      ws.end(1001, 'server shutting down');
    }
  }

  // ------------------------------------------------------------ frames

  private heldBack(ws: WebSocket<SocketState>): boolean {
    return ws.getBufferedAmount() > this.opts.maxBufferedBytes;
  }

  private handle(ws: WebSocket<SocketState>, frame: ArrayBuffer): void {
    try {
      this.handleFrame(ws, frame);
    } catch (err) {
      // Nothing a client sends may end the thread (it holds every socket of this gateway).
      this.sendError(ws, null, err);
    }
  }

  /** One frame: hello, cancel, or a request op. */
  private handleFrame(ws: WebSocket<SocketState>, frame: ArrayBuffer): void {
    const state = ws.getUserData();
    let msg: Record<string, unknown>;
    try {
      const decoded: unknown = decodeMsgpack(new Uint8Array(frame));
      if (typeof decoded !== 'object' || decoded === null || Array.isArray(decoded)) throw new Error('not an object');
      msg = decoded as Record<string, unknown>;
    } catch (err) {
      this.sendError(ws, null, new ValidationError(`frame is not a msgpack object: ${(err as Error).message}`));
      return;
    }
    const id = msg.id;
    if (msg.op === 'hello') return this.hello(ws, msg);
    if (typeof id !== 'string' && typeof id !== 'number') {
      this.sendError(ws, null, new ValidationError('every request needs an id (a string or a number)'));
      return;
    }
    if (msg.op === 'cancel') {
      const running = state.inflight.get(id);
      if (running) running.cancel('ws_cancel'); // its request rejects with CancelledError and answers
      else if (dropHeld(state, id)) this.sendError(ws, id, new CancelledError()); // still an unparsed held frame: it never runs
      return;
    }
    this.request(ws, id, msg);
  }

  /** {op: "hello", credit?}: the socket's credit (at most --ws-max-inflight) and the server's limits. */
  private hello(ws: WebSocket<SocketState>, msg: Record<string, unknown>): void {
    const state = ws.getUserData();
    const asked = msg.credit;
    if (asked !== undefined && (!Number.isInteger(asked) || (asked as number) < 1)) {
      this.sendError(ws, null, new ValidationError('hello.credit must be a positive integer'));
      return;
    }
    state.credit = Math.min(this.opts.maxInflight, (asked as number | undefined) ?? this.opts.maxInflight);
    const { maxFrameBytes } = this.opts;
    this.send(ws, { op: 'hello', credit: state.credit, max_frame_bytes: maxFrameBytes, max_client_batch_size: this.deps.limits.maxClientBatchSize, version: this.deps.version });
  }

  /** A request op: checked against the socket's credit and readiness, then run through the same pipeline as HTTP. */
  private request(ws: WebSocket<SocketState>, id: RequestId, msg: Record<string, unknown>): void {
    const state = ws.getUserData();
    // A Map: an op named "toString" or "__proto__" is just unknown.
    const op = typeof msg.op === 'string' ? msg.op : '';
    const endpoint = TEI_ENDPOINTS.get(op);
    const local = endpoint ? undefined : TEI_LOCAL_ENDPOINTS.get(op);
    if (!endpoint && !local) {
      const shownOp = typeof msg.op === 'string' ? shown(msg.op) : typeof msg.op;
      this.sendError(ws, id, new ValidationError(`unknown op ${shownOp}; expected one of hello, cancel, ${this.opNames.join(', ')}`));
      return;
    }
    const route = `ws:${op}`;
    const refusal = this.refusal(state, id, msg);
    if (refusal) {
      this.sendError(ws, id, refusal, route);
      return;
    }
    const cancel = new Cancellation();
    const span = this.span(op, route, msg);
    const ec: EndpointContext = {
      infer: this.deps.infer,
      limits: this.deps.limits,
      timeoutMs: msg.deadline_ms as number | undefined,
      priority: typeof msg.priority === 'string' ? msg.priority : undefined,
      cancel,
      f32: msg.encoding === 'f32',
      label: { model: 'unknown' },
      loadModel: this.deps.loadModel,
      trace: span?.ids,
    };
    const started = performance.now();
    const done = (served: Served) => {
      this.answered(ws, id, route, served, started);
      span?.end({ status: 200, model: served.model, result: served.result });
    };
    const failed = (err: unknown) => {
      span?.end({ status: statusOf(err), errorCode: errorCode(err), model: ec.label.model });
      state.inflight.delete(id);
      metricsOf(this.deps.metrics, route).failed(ec.label.model, 'error', (performance.now() - started) / 1000); // sendError counts the failure
      this.sendError(ws, id, cancel.cancelled && !(err instanceof SlabserveError) ? new CancelledError() : err, route, started, ec.label.model);
    };
    const body = frameBody(msg);
    if (local) {
      try {
        done(local.run(body, ec));
      } catch (err) {
        failed(err);
      }
      return;
    }
    state.inflight.set(id, cancel);
    runEndpoint(endpoint as Endpoint<unknown>, body, ec).then(done, failed);
  }

  /** A request op's span (tracing on and sampled), its parent from the frame's `traceparent` / `tracestate`. */
  private span(op: string, route: string, msg: Record<string, unknown>): RequestSpan | null {
    if (!this.deps.tracing) return null;
    const text = (v: unknown) => (typeof v === 'string' ? v : undefined);
    const carrier = { traceparent: text(msg.traceparent), tracestate: text(msg.tracestate) };
    return this.deps.tracing.start({ name: `WS ${op}`, transport: 'websocket', startedAt: nowMs(), carrier, route });
  }

  /** Why request `id` may not start now (a duplicate id, no credit, not ready, a bad deadline), or null. */
  private refusal(state: SocketState, id: RequestId, msg: Record<string, unknown>): SlabserveError | null {
    if (state.inflight.has(id)) return new ValidationError(`request id ${JSON.stringify(id)} is already in flight on this socket`);
    if (state.inflight.size >= state.credit) {
      const e = new OverloadedError(`${state.inflight.size} requests in flight: the socket's credit is ${state.credit}`);
      (e as { code: string }).code = 'SLABSERVE_CREDIT_EXCEEDED';
      return e;
    }
    if (!this.deps.ready()) return new NotReadyError();
    const deadline = msg.deadline_ms;
    if (deadline !== undefined && (typeof deadline !== 'number' || !(deadline >= 0))) return new ValidationError('deadline_ms must be a number of milliseconds >= 0');
    return null;
  }

  // ------------------------------------------------------------ answers

  private send(ws: WebSocket<SocketState>, message: unknown): void {
    const state = ws.getUserData();
    if (state.closed) return;
    ws.cork(() => ws.send(pack(message), true));
  }

  /** Sends a request's answer, counts and logs it. */
  private answered(ws: WebSocket<SocketState>, id: RequestId, route: string, served: Served, started: number): void {
    const state = ws.getUserData();
    state.inflight.delete(id);
    const ms = performance.now() - started;
    metricsOf(this.deps.metrics, route).ok(served, ms / 1000);
    this.send(ws, { id, result: isAnswer(served.payload) ? served.payload.value() : served.payload });
    if (this.deps.log.enabled) this.deps.log.record({ reqId: state.reqId, wsId: id, method: 'WS', route, path: '/ws', model: served.model, status: 200, ms });
  }

  /** Answers request `id` (null: a frame without one) with an error, and logs it (`op`: its op, `started`: when it began, `model`: if known). */
  private sendError(ws: WebSocket<SocketState>, id: RequestId | null, err: unknown, op = 'ws', started = performance.now(), model = 'unknown'): void {
    const e = err instanceof SlabserveError ? err : null;
    this.deps.metrics.failures.inc({ reason: e ? e.type : 'backend' });
    this.send(ws, { id, error: { type: e ? e.type : 'backend', code: e ? e.code : 'SLABSERVE_INTERNAL', message: e ? e.message : 'internal error' } });
    if (!this.deps.log.enabled && e) return;
    this.deps.log.record({
      reqId: ws.getUserData().reqId,
      method: 'WS',
      route: op,
      path: '/ws',
      model,
      status: statusOf(err),
      ms: performance.now() - started,
      code: e ? e.code : 'SLABSERVE_INTERNAL',
      ...(e ? {} : { error: err instanceof Error ? (err.stack ?? err.message) : String(err) }),
      ...(id !== null ? { wsId: id } : {}),
    });
  }
}

/** A request frame's body, as the HTTP route's: the frame less the fields only the socket reads. */
function frameBody(msg: Record<string, unknown>): Record<string, unknown> {
  const { id: _id, op: _op, deadline_ms: _deadline, encoding: _encoding, traceparent: _parent, tracestate: _state, ...body } = msg;
  return body;
}
