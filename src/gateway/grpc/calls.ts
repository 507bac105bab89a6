/**
 * The serving skeleton for gRPC (serving.ts's, for calls instead of HTTP
 * requests): one function per call shape, each doing, for every method,
 *
 *   the API key from `authorization: Bearer` metadata (UNAUTHENTICATED otherwise)
 *   not ready / no free slot: refused before the message is parsed, as HTTP refuses before the body
 *   the call's deadline is the request's (expired: DEADLINE_EXCEEDED, it never reaches the device),
 *     `x-priority` metadata its priority class, `x-request-id` its id in the access line
 *   the endpoint's parse / infer / answer (runEndpoint: the same path HTTP and WebSocket take)
 *   a cancelled call (the client went away, or its deadline passed) cancels its slots
 *   errors as status.ts maps them, the SLABSERVE_ code in the trailing metadata
 *   the route's metrics and an access line (method "GRPC")
 *
 * Streams: each message is one request, answered in the order they came; at
 * most `streamMaxInflight` run at once per stream, and a stream whose reader
 * does not read (its writes buffer) stops reading its own messages, which
 * holds back that client through HTTP/2 flow control and no other stream.
 * When the drain starts, a stream reads no more messages, answers those it has
 * read and ends with OK (open-streams.ts).
 */
import { Metadata, status as Status, type sendUnaryData, type ServerDuplexStream, type ServerReadableStream, type ServerUnaryCall } from '@grpc/grpc-js';
import { Cancellation } from '../../core/cancel.js';
import { CancelledError, DeadlineExceededError, SlabserveError, ValidationError } from '../../shared/errors.js';
import type { Task } from '../../shared/model-format/model-config.js';
import type { RouteAccess, Gate } from '../gate.js';
import { unauthorized } from '../gate.js';
import { statusOf } from '../http/request-context.js';
import type { AccessLog } from '../log.js';
import { requestId } from '../security.js';
import { errorCode, metricsOf, refuseBeforeBody, runEndpoint, type Endpoint, type EndpointContext, type LocalEndpoint, type ServeDeps, type Served } from '../serving.js';
import type { OpenStreams } from './open-streams.js';
import type { RequestSpan } from '../request-trace.js';
import { nowMs } from '../../shared/clock.js';
import { grpcStatusOf } from './status.js';

export interface GrpcDeps extends ServeDeps {
  gate: Gate;
  log: AccessLog;
  /** Most messages of one stream answered at once (--grpc-stream-max-inflight). */
  streamMaxInflight: number;
  /** This server's open streams, ended well by the drain. */
  streams: OpenStreams;
}

type AnyCall = ServerUnaryCall<unknown, unknown> | ServerReadableStream<unknown, unknown> | ServerDuplexStream<unknown, unknown>;

/** What one call (or one message of a stream) needs beside its message. */
export interface CallScope {
  deps: GrpcDeps;
  /** The metrics route and access line's: the full method name, e.g. /tei.v1.Embed/Embed. */
  route: string;
  /** The call's metadata, for a method's own fields (x-model). */
  metadata: Metadata;
  /** A new EndpointContext for one request of this call, its scheduling from the call. */
  context(label: { model: string }, cancel: Cancellation): EndpointContext;
}

/** The first value of a text metadata key, or undefined. */
export function metadataText(md: Metadata, key: string): string | undefined {
  const v = md.get(key)[0];
  return typeof v === 'string' ? v : v instanceof Buffer ? v.toString('utf8') : undefined;
}

/** Ms left before the call's deadline (undefined: none). A deadline already past throws DEADLINE_EXCEEDED. */
function timeLeftMs(call: AnyCall): number | undefined {
  const d = call.getDeadline();
  const at = d instanceof Date ? d.getTime() : d;
  if (!Number.isFinite(at)) return undefined;
  const left = at - Date.now();
  if (left <= 0) throw new DeadlineExceededError('the call\'s deadline passed before it reached the server');
  return left;
}

function scopeOf(call: AnyCall, deps: GrpcDeps, route: string, access: RouteAccess): CallScope {
  deps.gate.touch();
  if (access !== 'open') {
    const keys = access === 'admin' ? deps.gate.adminKeys : deps.gate.keys;
    const refused = unauthorized(keys.authorize(metadataText(call.metadata, 'authorization') ?? ''));
    if (refused) throw refused;
  }
  const timeoutMs = timeLeftMs(call);
  const priority = metadataText(call.metadata, 'x-priority');
  return {
    deps,
    route,
    metadata: call.metadata,
    context: (label, cancel) => ({ infer: deps.infer, limits: deps.limits, timeoutMs, priority, cancel, label, loadModel: deps.loadModel }),
  };
}

/** Counts and logs one answered or failed request of method `route`, by the status it ended with (a refused key too). */
function finished(deps: GrpcDeps, route: string, call: AnyCall, started: number, model: string, err?: unknown): void {
  const seconds = (performance.now() - started) / 1000;
  const metrics = metricsOf(deps.metrics, route);
  const status = err === undefined ? 200 : statusOf(err);
  if (err !== undefined) {
    metrics.countFailure(err);
    metrics.failed(model, status, seconds);
  }
  const log = deps.log;
  const internal = err !== undefined && !(err instanceof SlabserveError);
  if (!log.enabled && !internal) return;
  log.record({
    reqId: requestId(metadataText(call.metadata, 'x-request-id') ?? ''),
    method: 'GRPC',
    route,
    path: route,
    model,
    status,
    ms: seconds * 1000,
    ...(err instanceof SlabserveError ? { code: err.code } : {}),
    ...(internal ? { code: 'SLABSERVE_INTERNAL', error: err instanceof Error ? (err.stack ?? err.message) : String(err) } : {}),
  });
}

/** An answered request: its route metrics (inputs, queue time, duration) and its access line. */
function succeeded(deps: GrpcDeps, route: string, call: AnyCall, started: number, served: Served): void {
  metricsOf(deps.metrics, route).ok(served, (performance.now() - started) / 1000);
  finished(deps, route, call, started, served.model);
}

/** A cancellation that follows the call: cancelled by the client, or by grpc-js when its deadline passes. */
function cancellationOf(call: AnyCall): Cancellation {
  const cancel = new Cancellation();
  (call as NodeJS.EventEmitter).once('cancelled', () => cancel.cancel('client_disconnect'));
  return cancel;
}

/** An error as the call's status (cancellations that surfaced as something else read CANCELLED). */
function statusFor(err: unknown, cancel: Cancellation | null) {
  return grpcStatusOf(cancel?.cancelled && !(err instanceof SlabserveError) ? new CancelledError() : err);
}

/** What an inference method runs: its endpoint, and how it reads the message (the endpoint's body). */
export interface InferenceMethod<Req, S> {
  endpoint: Endpoint<S>;
  /** The message as the endpoint's body (the HTTP route's JSON body). */
  body(req: Req, scope: CallScope): unknown;
  /** The model the message names outside its body (KServe's model_name): refused before parsing when it has no free slot. */
  pathModel?(req: Req): string | undefined;
}

/** One request through the skeleton: refuse, parse, infer, answer (Served.payload is the reply message). */
async function serveOne<Req, S>(m: InferenceMethod<Req, S>, req: Req, scope: CallScope, cancel: Cancellation, label: { model: string }): Promise<Served> {
  const span = callSpan(scope);
  try {
    refuseBeforeBody(scope.deps, m.endpoint.task, m.pathModel?.(req), label);
    const served = await runEndpoint(m.endpoint, m.body(req, scope), { ...scope.context(label, cancel), trace: span?.ids });
    span?.end({ status: 200, model: served.model, result: served.result });
    return served;
  } catch (err) {
    span?.end({ status: statusOf(err), errorCode: errorCode(err), model: label.model });
    throw err;
  }
}

/** A call's (or a stream message's) span, tracing on and sampled: its parent from `traceparent` / `tracestate` metadata. */
function callSpan(scope: CallScope): RequestSpan | null {
  const tracing = scope.deps.tracing;
  if (!tracing) return null;
  const carrier = { traceparent: metadataText(scope.metadata, 'traceparent'), tracestate: metadataText(scope.metadata, 'tracestate') };
  return tracing.start({ name: `GRPC ${scope.route}`, transport: 'grpc', startedAt: nowMs(), carrier, requestId: metadataText(scope.metadata, 'x-request-id'), route: scope.route });
}

/** A unary method that runs the model. */
export function unaryInference<Req, S>(deps: GrpcDeps, route: string, m: InferenceMethod<Req, S>) {
  return (call: ServerUnaryCall<Req, unknown>, callback: sendUnaryData<unknown>): void => {
    const started = performance.now();
    const label = { model: 'unknown' };
    let cancel: Cancellation | null = null;
    const fail = (err: unknown) => {
      finished(deps, route, call, started, label.model, err);
      callback(statusFor(err, cancel));
    };
    try {
      const scope = scopeOf(call, deps, route, 'key');
      cancel = cancellationOf(call);
      serveOne(m, call.request, scope, cancel, label).then((served) => {
        succeeded(deps, route, call, started, served);
        callback(null, served.payload);
      }, fail);
    } catch (err) {
      fail(err);
    }
  };
}

/** A unary method that answers without the model (metadata, tokenize): `answer` returns the reply (or its promise). */
export function unaryLocal<Req>(deps: GrpcDeps, route: string, answer: (req: Req, scope: CallScope) => unknown, access: RouteAccess = 'key') {
  return (call: ServerUnaryCall<Req, unknown>, callback: sendUnaryData<unknown>): void => {
    const started = performance.now();
    const fail = (err: unknown) => {
      finished(deps, route, call, started, 'unknown', err);
      callback(statusFor(err, null));
    };
    try {
      const scope = scopeOf(call, deps, route, access);
      Promise.resolve(answer(call.request, scope)).then((reply) => {
        finished(deps, route, call, started, 'unknown');
        callback(null, reply);
      }, fail);
    } catch (err) {
      fail(err);
    }
  };
}

/** A LocalEndpoint (tokenize, decode) as a method's answer: `reply` shapes its payload. */
export function localEndpoint<Req>(ep: LocalEndpoint, body: (req: Req, scope: CallScope) => unknown, reply: (payload: unknown) => unknown) {
  return (req: Req, scope: CallScope): unknown => {
    const label = { model: 'unknown' };
    return reply(ep.run(body(req, scope), scope.context(label, new Cancellation())).payload);
  };
}

/**
 * A bidirectional stream: every message one request (`serve`), answered in
 * order. The first failure ends the call with its status, once the answers
 * before it are written; the requests after it are cancelled.
 */
export function streamOf<Req>(deps: GrpcDeps, route: string, serve: (req: Req, scope: CallScope, cancel: Cancellation, label: { model: string }) => Promise<Served>) {
  return (call: ServerDuplexStream<Req, unknown>): void => {
    let scope: CallScope;
    try {
      scope = scopeOf(call, deps, route, 'key');
    } catch (err) {
      finished(deps, route, call, performance.now(), 'unknown', err);
      call.emit('error', statusFor(err, null));
      return;
    }
    const queue: { done: Promise<Served | { err: unknown }>; cancel: Cancellation; started: number; label: { model: string } }[] = [];
    let ended = false; // the call has its status
    let inputDone = false; // no more messages: the client half-closed, or the drain started
    let writing = false;
    const cancelAll = (why: string) => {
      for (const q of queue) q.cancel.cancel(why);
    };
    const forget = deps.streams.add(() => {
      if (ended || inputDone) return;
      inputDone = true;
      call.pause();
      void flush();
    });
    const end = () => {
      ended = true;
      forget();
    };
    call.once('cancelled', () => {
      end();
      cancelAll('client_disconnect');
    });
    const endWith = (err: unknown, cancel: Cancellation) => {
      end();
      cancelAll('stream_failed');
      call.emit('error', statusFor(err, cancel));
    };
    const holdBack = () => queue.length >= deps.streamMaxInflight || call.writableNeedDrain;
    /** Writes every answered request at the head, in order; then reads on if there is room. */
    const flush = async () => {
      if (writing) return;
      writing = true;
      while (queue.length > 0 && !ended) {
        const head = queue[0]!;
        const out = await head.done;
        if (ended) break;
        queue.shift();
        if ('err' in out) {
          finished(deps, route, call, head.started, head.label.model, out.err);
          endWith(out.err, head.cancel);
          break;
        }
        succeeded(deps, route, call, head.started, out);
        if (!call.write(out.payload)) await drained(call);
        if (!holdBack() && call.isPaused()) call.resume(); // room again: read on while the rest are answered
      }
      writing = false;
      if (ended) return;
      if (!holdBack() && call.isPaused()) call.resume();
      if (inputDone && queue.length === 0) {
        end();
        call.end();
      }
    };
    call.on('data', (req: Req) => {
      if (ended || inputDone) return; // read after the drain started: not answered (the stream ends OK before it)
      const cancel = new Cancellation();
      const label = { model: 'unknown' };
      const done = serve(req, scope, cancel, label).catch((err: unknown) => ({ err }));
      queue.push({ done, cancel, started: performance.now(), label });
      if (holdBack()) call.pause();
      void flush();
    });
    call.on('end', () => {
      inputDone = true;
      void flush();
    });
  };
}

/** Resolves once the call's write buffer has drained, or the call is cancelled (then no drain comes). */
function drained(call: ServerDuplexStream<unknown, unknown>): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      call.off('drain', done);
      call.off('cancelled', done);
      resolve();
    };
    call.on('drain', done);
    call.on('cancelled', done);
  });
}

/** A stream method that runs the model, each message through `m`. */
export function streamInference<Req, S>(deps: GrpcDeps, route: string, m: InferenceMethod<Req, S>) {
  return streamOf<Req>(deps, route, (req, scope, cancel, label) => serveOne(m, req, scope, cancel, label));
}

/** A stream method that does not run the model: each message answered by `answer`. */
export function streamLocal<Req>(deps: GrpcDeps, route: string, answer: (req: Req, scope: CallScope) => unknown) {
  return streamOf<Req>(deps, route, async (req, scope) => ({ payload: answer(req, scope), model: 'unknown', inputs: 1 }));
}

/**
 * A client stream gathered into one request (TEI's RerankStream: one text per
 * message, one answer): at most `maxMessages`, then `serve` runs once.
 */
export function gatheredInference<Req, S>(deps: GrpcDeps, route: string, maxMessages: () => number, m: { endpoint: Endpoint<S>; body(reqs: Req[], scope: CallScope): unknown }) {
  return (call: ServerReadableStream<Req, unknown>, callback: sendUnaryData<unknown>): void => {
    const started = performance.now();
    const label = { model: 'unknown' };
    const cancel = cancellationOf(call);
    let scope: CallScope;
    const fail = (err: unknown) => {
      finished(deps, route, call, started, label.model, err);
      callback(statusFor(err, cancel));
    };
    try {
      scope = scopeOf(call, deps, route, 'key');
    } catch (err) {
      fail(err);
      return;
    }
    const reqs: Req[] = [];
    let failed = false;
    call.on('data', (req: Req) => {
      if (failed) return;
      if (reqs.length >= maxMessages()) {
        failed = true;
        fail(new ValidationError(`more than ${maxMessages()} messages in one stream (--max-client-batch-size)`));
        return;
      }
      reqs.push(req);
    });
    call.on('end', () => {
      if (failed) return;
      serveOne({ endpoint: m.endpoint, body: (r: Req[], s) => m.body(r, s) }, reqs, scope, cancel, label).then((served) => {
        succeeded(deps, route, call, started, served);
        callback(null, served.payload);
      }, fail);
    });
  };
}

export { Status };
