/**
 * What the route tables share: serving a transport-free operation
 * (operations.ts) over HTTP, timing headers, and request metrics.
 */
import { NotReadyError } from '../shared/errors.js';
import type { Task } from '../shared/model-config.js';
import type { InferenceClient, Timing } from './inference-client.js';
import { statusOf, type RequestContext } from './http.js';
import type { Operation } from './operations.js';
import type { RouteDeps } from './routes.js';

export const ms = (v: number): string => String(Math.round(v * 1000) / 1000);

/** x-tokenization-time, x-queue-time, x-inference-time, x-total-time (ms), as TEI sends them. */
export function timingHeaders(ctx: RequestContext, tokenizeMs: number, timing: Timing): Record<string, string> {
  return {
    'x-tokenization-time': ms(tokenizeMs),
    'x-queue-time': ms(timing.queueMs),
    'x-inference-time': ms(timing.inferenceMs),
    'x-total-time': ms(performance.now() - ctx.startedAt),
  };
}

/** Records a finished request: its duration by model, route and status; a failure by reason. */
export function observe(deps: RouteDeps, ctx: RequestContext, route: string, model: string, status: number, err?: unknown): void {
  ctx.model = model;
  if (err !== undefined) deps.metrics.failures.inc({ reason: (err as { type?: string }).type ?? 'backend' });
  deps.metrics.requestDuration.observe({ model, route, status: String(status) }, (performance.now() - ctx.startedAt) / 1000);
}

/** Cancellation, deadline and priority of a call from the request's headers (for routes that call the client directly). */
export function headerCall(ctx: RequestContext, client: InferenceClient): { signal: AbortSignal; timeoutMs?: number; priority?: number } {
  const h = ctx.scheduling();
  return {
    signal: ctx.abort.signal,
    ...(h.timeoutMs !== undefined ? { timeoutMs: h.timeoutMs } : {}),
    ...(h.priority !== undefined ? { priority: client.priorityIndex(h.priority) } : {}),
  };
}

export interface ServeOptions {
  /** Metrics label. */
  route: string;
  /** Needs the inference thread: refused with 503 while not ready or draining. */
  inference: boolean;
  /** The task of the models it runs on: refused with 429 before its body is read while none of them has a free slot. */
  task?: Task;
  pathModel?: string;
}

/**
 * What an inference request is refused with before its body is read: 503 while
 * not ready, 429 while the models it may use have no free slot (or, with a
 * latency target, their queues alone would miss it). Call it in the route's
 * synchronous part, before reading the body: answering then costs no body
 * reading, parsing or tokenizing. uWS reads and drops the body that follows,
 * and the keep-alive connection serves the next request. Sets `label.model`
 * when the refusal concerns one known model.
 */
export function refuseBeforeBody(deps: RouteDeps, task: Task | null, pathModel: string | undefined, label: { model: string }): void {
  if (!deps.ready()) throw new NotReadyError();
  const refusal = deps.client.refusalBeforeBody(task, pathModel);
  if (!refusal) return;
  if (refusal.model !== undefined) label.model = refusal.model;
  throw refusal.error;
}

/** Serves one operation (src/gateway/operations.ts) over HTTP, errors in our `{error, type, code}` shape. */
export async function serveOperation(ctx: RequestContext, deps: RouteDeps, op: Operation, opts: ServeOptions): Promise<void> {
  const label = { model: 'unknown' }; // a model name becomes a label only once it is known to exist
  let model = 'unknown';
  try {
    if (opts.inference && !deps.ready()) throw new NotReadyError();
    if (opts.task !== undefined) refuseBeforeBody(deps, opts.task, opts.pathModel, label);
    const raw = await ctx.readPayload(deps.limits.maxBodyBytes);
    const r = await op(deps.client, deps.limits, raw, {
      signal: ctx.abort.signal,
      ...ctx.scheduling(),
      ...(opts.pathModel !== undefined ? { pathModel: opts.pathModel } : {}),
      onModel: (m) => (model = m.plan.spec.name),
    });
    model = r.model.plan.spec.name;
    ctx.model = model;
    if (opts.inference) {
      deps.metrics.inputs.inc({ model, route: opts.route }, r.inputs);
      deps.metrics.queueDuration.observe({ model }, r.timing.queueMs / 1000);
    }
    ctx.send(200, r.payload, opts.inference ? timingHeaders(ctx, r.tokenizeMs, r.timing) : {});
    observe(deps, ctx, opts.route, model, 200);
  } catch (err) {
    if (model === 'unknown') model = label.model;
    observe(deps, ctx, opts.route, model, statusOf(err), err);
    ctx.fail(err);
  }
}

export { errorInfo, type ErrorInfo } from './http.js';
