/**
 * The serving skeleton: one path for every inference request, whatever its
 * dialect (TEI's /embed, /predict, /rerank; OpenAI's /v1/embeddings;
 * KServe's infer) and transport (HTTP here, WebSocket in src/gateway/ws/api.ts):
 *
 *   HTTP: refuse before the body (not ready 503; no free slot for its models 429)
 *         read and decode the body (JSON or msgpack)
 *   endpoint.parse(body)   the call (model, inputs, deadline, priority) and what the answer needs
 *   infer.infer(call)      slots, tokens, rows, timing (src/core/infer.ts)
 *   endpoint.answer(...)   the body in the dialect's shape
 *   HTTP: timing headers (and x-cache: hit|miss); request metrics; the gate writes the access line
 *
 * A dialect is a set of endpoints (a body parser and an answer shaper each)
 * and an error shape; it never repeats the steps above. Endpoints that do not
 * run the model (/tokenize, /decode) are LocalEndpoints: parse and answer in one.
 */
import type { Cancellation } from '../core/cancel.js';
import { InputTooLongError, ModelNotFoundError, NotReadyError } from '../shared/errors.js';
import type { GatewayMetrics } from '../shared/telemetry/metrics.js';
import type { CounterCell, HistogramCell } from '../shared/telemetry/metric-cells.js';
import type { Task } from '../shared/model-format/model-config.js';
import type { LongInputs } from '../shared/options.js';
import { statusOf, type Answer, type RequestContext } from './http/request-context.js';
import type { InferCall, Infer, InferResult } from '../core/infer.js';
import type { SpanIds } from '../shared/trace-context.js';
import type { RequestSpan, RequestTracing } from './request-trace.js';

export interface GatewayLimits {
  /** Most bytes in a request body (--max-body-bytes). */
  maxBodyBytes: number;
  /** Most inputs in one request (--max-client-batch-size). */
  maxClientBatchSize: number;
  /** Whether an input past the model's max length is cut when its request does not say (--long-inputs truncate, --truncate); else 413 or chunked. */
  truncate: boolean;
  /** What happens to an input past the model's max length when its request does not say (--long-inputs); default error, or truncate with `truncate`. */
  longInputs?: LongInputs | undefined;
  /** Most tokens of a chunked input (--max-input-tokens); absent: 8 times the model's length. */
  maxInputTokens?: number | undefined;
  /** Tokens a window repeats of the one before (--chunk-overlap-tokens). */
  chunkOverlapTokens?: number | undefined;
  /** What integer inputs of /v1/embeddings are when a request does not say (--openai-token-ids); default cl100k_base. */
  openaiTokenIds?: 'cl100k_base' | 'model' | undefined;
}

/** What a body parser may use beside the body. */
export interface EndpointContext {
  infer: Infer;
  limits: GatewayLimits;
  /** A model named outside the body (the URL path); must agree with the body's. */
  pathModel?: string | undefined;
  /** The route's path parameters, in order (the model name first, where it has one). */
  params?: readonly string[] | undefined;
  /** The transport's deadline (x-deadline-ms, a frame's deadline_ms) and priority class (x-priority): the body's own fields win. */
  timeoutMs?: number | undefined;
  priority?: string | undefined;
  cancel: Cancellation;
  /** WebSocket: embedding rows as little-endian float32 bytes. */
  f32?: boolean;
  /** The client's User-Agent (HTTP): tells Hugging Face's clients from TEI's where their bodies are alike. */
  userAgent?: string | undefined;
  /** The model the request turned out to use, set by the parser as soon as it is known (metrics, access log; 'unknown' until then). */
  label: { model: string };
  /**
   * Lazy loading (--lazy-load): loads model `name` of the repository, resolving true once it takes
   * requests (concurrent first requests share one load), false at once when the repository has no
   * such folder; rejects with the load's failure, or past `timeoutMs`. Absent: off.
   */
  loadModel?: ((name: string, timeoutMs: number) => Promise<boolean>) | undefined;
  /** The request's sampled span (tracing): its slots carry it (InferCall.trace). */
  trace?: SpanIds | undefined;
}

/** One inference endpoint of a dialect. */
export interface Endpoint<S = unknown> {
  /** The metrics label (never the raw URL). */
  route: string;
  /** The task of the models it runs on: with none of them free, refused before its body is read (null: any model). */
  task: Task | null;
  /** The call a body asks for, and what its answer needs (`state`). Throws the dialect's validation errors. */
  parse(body: unknown, ec: EndpointContext): { call: InferCall; state: S };
  /** The answer's payload: a plain value, or an Answer that serialises itself. */
  answer(r: InferResult, call: InferCall, state: S, ec: EndpointContext): unknown;
  /** How this body asks to cut a too-long input, the advice of its 413 (absent: `send "truncate": true to cut it`). */
  truncateAdvice?(state: S): string;
}

/**
 * The priority class of an integer priority (Cohere's and vLLM's: 0 the
 * highest, larger later): class 0 for 0 or less, else the class of that rank,
 * the last for any beyond. Absent: the transport's (x-priority), else the default.
 */
export function priorityOfRank(ec: EndpointContext, rank: number | undefined): number | undefined {
  if (rank === undefined) return ec.priority === undefined ? undefined : ec.infer.priorityIndex(ec.priority);
  return Math.min(Math.max(0, rank), ec.infer.priorityClasses.length - 1);
}

/** An endpoint that does not run the model (tokenize, decode). */
export interface LocalEndpoint {
  route: string;
  run(body: unknown, ec: EndpointContext): { payload: unknown; model: string; inputs: number };
}

/** What a request produced: its payload and what the metrics need. */
export interface Served {
  payload: unknown;
  model: string;
  inputs: number;
  result?: InferResult;
}

/** Whether a payload serialises itself. */
export function isAnswer(x: unknown): x is Answer & { value(): unknown } {
  return typeof x === 'object' && x !== null && typeof (x as Answer).json === 'function' && typeof (x as { value?: unknown }).value === 'function';
}

/**
 * The pipeline without its transport: parse, infer, answer. `ec.label`
 * names the model as soon as the body names a loaded one (a failure later
 * is still counted and logged under it).
 */
export async function runEndpoint<S>(ep: Endpoint<S>, body: unknown, ec: EndpointContext): Promise<Served> {
  const { call, state } = await parseLoading(ep, body, ec);
  const model = (ec.label.model = call.model.plan.spec.name);
  let result: InferResult;
  try {
    result = await ec.infer.infer(ec.trace ? { ...call, trace: ec.trace } : call);
  } catch (err) {
    // The advice must be one that works on this route: its own way of asking for truncation.
    if (err instanceof InputTooLongError && ep.truncateAdvice) throw new InputTooLongError(err.length, err.maxLength, ep.truncateAdvice(state), err.bound);
    throw err;
  }
  return { payload: ep.answer(result, call, state, ec), model, inputs: result.rows.rows.length / result.rows.width, result };
}

/** `ep.parse`; with lazy loading, a request naming a model of the repository that is not loaded loads it (within its deadline) and is parsed again. */
async function parseLoading<S>(ep: Endpoint<S>, body: unknown, ec: EndpointContext): Promise<{ call: InferCall; state: S }> {
  try {
    return ep.parse(body, ec);
  } catch (err) {
    if (!(err instanceof ModelNotFoundError) || !ec.loadModel) throw err;
    if (!(await ec.loadModel(err.model, ec.timeoutMs ?? ec.infer.requestTimeoutMs))) throw err;
    return ep.parse(body, ec);
  }
}

// ---------------------------------------------------------------- metrics, bound once per model

/** A route's request metrics, their label children bound once per model (no label hashing per request). */
export class RouteMetrics {
  private readonly m: GatewayMetrics;
  private readonly route: string;
  private readonly bound = new Map<string, { inputs: CounterCell; queue: HistogramCell; ok: HistogramCell }>();

  constructor(metrics: GatewayMetrics, route: string) {
    this.m = metrics;
    this.route = route;
  }

  private children(model: string) {
    let c = this.bound.get(model);
    if (!c) {
      c = {
        inputs: this.m.inputs.cell({ model, route: this.route }),
        queue: this.m.queueDuration.cell({ model }),
        ok: this.m.requestDuration.cell({ model, route: this.route, status: '200' }),
      };
      this.bound.set(model, c);
    }
    return c;
  }

  /** An answered request (status 200). */
  ok(s: Served, seconds: number): void {
    const c = this.children(s.model);
    if (s.result) {
      c.inputs.inc(s.inputs);
      c.queue.observe(s.result.timing.queueMs / 1000);
    }
    c.ok.observe(seconds);
  }

  /** A request answered with an error (`status` as its dialect answers it; `error` over WebSocket): its duration. */
  failed(model: string, status: number | 'error', seconds: number): void {
    this.m.requestDuration.observe({ model, route: this.route, status: String(status) }, seconds);
  }

  /** An error answered, by reason (its type). */
  countFailure(err: unknown): void {
    this.m.failures.inc({ reason: (err as { type?: string })?.type ?? 'backend' });
  }
}

const routeMetrics = new WeakMap<GatewayMetrics, Map<string, RouteMetrics>>();

/** The RouteMetrics of `route` over `metrics` (made once, then shared by HTTP and WebSocket). */
export function metricsOf(metrics: GatewayMetrics, route: string): RouteMetrics {
  let byRoute = routeMetrics.get(metrics);
  if (!byRoute) routeMetrics.set(metrics, (byRoute = new Map()));
  let m = byRoute.get(route);
  if (!m) byRoute.set(route, (m = new RouteMetrics(metrics, route)));
  return m;
}

// ---------------------------------------------------------------- HTTP

/** Routes' dependencies. */
export interface ServeDeps {
  infer: Infer;
  limits: GatewayLimits;
  metrics: GatewayMetrics;
  /** Warmed up, inference alive, not draining. */
  ready(): boolean;
  /** Lazy loading (EndpointContext.loadModel); absent: off. */
  loadModel?: EndpointContext['loadModel'];
  /** Tracing on: this thread's request spans (request-trace.ts). */
  tracing?: RequestTracing | undefined;
}

/** The SLABSERVE_ code of an error, for spans. */
export function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** Answers an error in a dialect's shape (ours, OpenAI's, KServe's) and says which status it used. */
export type Fail = (ctx: RequestContext, err: unknown) => number;

/** ms with three decimals, by integer arithmetic: x-*-time headers as TEI sends them. */
export function ms(v: number): string {
  const us = Math.round(Math.max(0, v) * 1000);
  const frac = us % 1000;
  return `${(us - frac) / 1000}.${frac < 10 ? '00' : frac < 100 ? '0' : ''}${frac}`;
}

function timingHeaders(ctx: RequestContext, r: InferResult | undefined): Record<string, string> {
  const total = ms(performance.now() - ctx.startedAt);
  if (!r) return { 'x-total-time': total };
  const headers: Record<string, string> = {
    'x-tokenization-time': ms(r.tokenizeMs),
    'x-queue-time': ms(r.timing.queueMs),
    'x-inference-time': ms(r.timing.inferenceMs),
    'x-total-time': total,
  };
  if (r.cache) headers['x-cache'] = r.cache; // hit: every input from the result cache; absent with --cache-mb 0
  if (r.windows !== undefined) headers['x-windows'] = String(r.windows); // a chunked request: the windows it ran
  return headers;
}

/**
 * What an inference request is refused with before its body is read: 503
 * while not ready, 429 while the models it may use have no free slot (or,
 * with a latency target, their queues alone would miss it). Answering then
 * costs no body reading, parsing or tokenizing; uWS reads and drops the body
 * that follows, and the keep-alive connection serves the next request. Sets
 * `label.model` when the refusal concerns one known model.
 */
export function refuseBeforeBody(deps: ServeDeps, task: Task | null, pathModel: string | undefined, label: { model: string }): void {
  if (!deps.ready()) throw new NotReadyError();
  const refusal = deps.infer.refusalBeforeBody(task, pathModel);
  if (!refusal) return;
  if (refusal.model !== undefined) label.model = refusal.model;
  throw refusal.error;
}

/** The context a parser gets for an HTTP request. */
function httpContext(ctx: RequestContext, deps: ServeDeps, params: readonly string[] | undefined, label: { model: string }, span: RequestSpan | null): EndpointContext {
  const h = ctx.scheduling();
  return { infer: deps.infer, limits: deps.limits, pathModel: params?.[0], params, timeoutMs: h.timeoutMs, priority: h.priority, cancel: ctx.cancel, label, userAgent: ctx.userAgent, loadModel: deps.loadModel, trace: span?.ids };
}

/** An HTTP request's span (tracing on and sampled), its parent from traceparent. */
function httpSpan(ctx: RequestContext, deps: ServeDeps, route: string): RequestSpan | null {
  if (!deps.tracing) return null;
  const startedAt = performance.timeOrigin + ctx.startedAt;
  return deps.tracing.start({ name: `${ctx.method} ${route}`, transport: 'http', startedAt, carrier: ctx.traceContext, requestId: ctx.requestId, route });
}

/** Serves one inference endpoint over HTTP (see the header). */
export function serveInference<S>(ctx: RequestContext, deps: ServeDeps, ep: Endpoint<S>, fail: Fail = ourFail, params?: readonly string[]): Promise<void> {
  return serveHttp(ctx, deps, ep.route, fail, params, ep.task, (body, ec) => runEndpoint(ep, body, ec));
}

/** Serves an endpoint that does not run the model over HTTP (never refused before its body: it needs no slot). */
export function serveLocal(ctx: RequestContext, deps: ServeDeps, ep: LocalEndpoint, fail: Fail = ourFail, params?: readonly string[]): Promise<void> {
  return serveHttp(ctx, deps, ep.route, fail, params, undefined, (body, ec) => ep.run(body, ec));
}

/** The HTTP skeleton: refuse before the body (when `refuse` names a task), read it, run, answer, count. */
async function serveHttp(
  ctx: RequestContext,
  deps: ServeDeps,
  route: string,
  fail: Fail,
  params: readonly string[] | undefined,
  refuse: Task | null | undefined,
  run: (body: unknown, ec: EndpointContext) => Served | Promise<Served>,
): Promise<void> {
  const metrics = metricsOf(deps.metrics, route);
  const label = { model: 'unknown' }; // a model name becomes a label only once it is known to exist
  const span = httpSpan(ctx, deps, route);
  try {
    if (refuse !== undefined) refuseBeforeBody(deps, refuse, params?.[0], label);
    const body = await ctx.readPayload(deps.limits.maxBodyBytes);
    const pending = run(body, httpContext(ctx, deps, params, label, span));
    const served = pending instanceof Promise ? await pending : pending;
    ctx.model = served.model;
    sendServed(ctx, served);
    metrics.ok(served, (performance.now() - ctx.startedAt) / 1000);
    span?.end({ status: 200, model: served.model, result: served.result });
  } catch (err) {
    ctx.model = label.model;
    metrics.countFailure(err);
    const status = fail(ctx, err);
    metrics.failed(label.model, status, (performance.now() - ctx.startedAt) / 1000);
    span?.end({ status, errorCode: errorCode(err), model: label.model });
  }
}

function sendServed(ctx: RequestContext, s: Served): void {
  const headers = s.result ? timingHeaders(ctx, s.result) : undefined;
  if (isAnswer(s.payload)) ctx.answer(200, s.payload, headers);
  else ctx.send(200, s.payload, headers);
}

/** Our error shape, `{error, error_type, type, code}` (TEI's with our family and code), with our status. */
export const ourFail: Fail = (ctx, err) => ctx.fail(err);

/** An error's status as we answer it (metrics of routes that answer errors their own way). */
export { statusOf };
