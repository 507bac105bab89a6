/**
 * The HTTP API of one gateway thread. Routes (JSON by default; msgpack with
 * Content-Type / Accept application/msgpack):
 *
 *   POST /embed                    {inputs, normalize?, truncate?, model?} -> number[][]
 *   POST /predict                  {inputs, raw_scores?, truncate?, model?} -> [{label, score}] (or one list per input)
 *   POST /models/{name}/embed      the same, model named in the path
 *   POST /models/{name}/predict
 *   GET  /info                     models, tasks, device, batching, limits, version
 *   GET  /health                   200 when ready
 *   GET  /livez                    200 while this thread's event loop runs (never waits on inference)
 *   GET  /readyz                   200 when warmed up, the inference thread's heartbeat is fresh, not draining
 *   GET  /metrics                  Prometheus text, every thread aggregated
 *
 * Responses carry x-queue-time, x-inference-time, x-tokenization-time and
 * x-total-time (ms), as text-embeddings-inference sends them.
 */
import { nowMs } from '../shared/clock.js';
import { NotReadyError, ValidationError } from '../shared/errors.js';
import type { GatewayMetrics } from '../shared/metrics.js';
import type { Task } from '../shared/model-config.js';
import type { ClientModel, InferenceClient, Timing } from './inference-client.js';
import { HttpError, RequestContext, statusOf } from './http.js';
import { EmbedRequest, parseBody, PredictRequest } from './schemas.js';
import type { HttpRequest, HttpResponse, TemplatedApp } from './uws.js';

export interface GatewayLimits {
  /** Most bytes in a request body (--max-body-bytes). */
  maxBodyBytes: number;
  /** Most inputs in one request (--max-client-batch-size). */
  maxClientBatchSize: number;
}

export interface RouteDeps {
  client: InferenceClient;
  limits: GatewayLimits;
  metrics: GatewayMetrics;
  /** Warmed up, inference alive, not draining. */
  ready(): boolean;
  /** The /info document. */
  info(): unknown;
  /** Prometheus text for the whole process. */
  scrape(): Promise<string>;
}

const PROMETHEUS_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

/** One route: a method, a uWS path pattern, and its handler (`params` are the pattern's :parts in order). */
export interface Route {
  method: 'get' | 'post';
  path: string;
  handle(ctx: RequestContext, deps: RouteDeps, params: string[]): void | Promise<void>;
}

/** The core API: TEI-style /embed and /predict, health, info, metrics. */
export const coreRoutes: Route[] = [
  { method: 'post', path: '/embed', handle: (ctx, deps) => handleInference(ctx, deps, 'embed', '/embed', undefined) },
  { method: 'post', path: '/predict', handle: (ctx, deps) => handleInference(ctx, deps, 'classify', '/predict', undefined) },
  { method: 'post', path: '/models/:name/embed', handle: (ctx, deps, [name]) => handleInference(ctx, deps, 'embed', '/embed', name) },
  { method: 'post', path: '/models/:name/predict', handle: (ctx, deps, [name]) => handleInference(ctx, deps, 'classify', '/predict', name) },
  { method: 'get', path: '/info', handle: (ctx, deps) => ctx.send(200, deps.info()) },
  { method: 'get', path: '/livez', handle: (ctx) => ctx.send(200, { status: 'alive' }) },
  { method: 'get', path: '/readyz', handle: (ctx, deps) => readiness(ctx, deps) },
  { method: 'get', path: '/health', handle: (ctx, deps) => readiness(ctx, deps) },
  { method: 'get', path: '/metrics', handle: async (ctx, deps) => ctx.write(200, PROMETHEUS_TYPE, await deps.scrape()) },
];

function readiness(ctx: RequestContext, deps: RouteDeps): void {
  if (deps.ready()) ctx.send(200, { status: 'ready' });
  else ctx.send(503, { status: 'not ready', error: 'warming up, inference thread not answering, or draining', type: 'unavailable' });
}

/**
 * Registers `routes`, then a 405 (with Allow) for every known path asked with
 * another method, then a 404 for everything else.
 */
export function registerRoutes(app: TemplatedApp, deps: RouteDeps, routes: Route[] = coreRoutes): void {
  const allow = new Map<string, string[]>();
  for (const route of routes) {
    const paramCount = (route.path.match(/\/:/g) ?? []).length;
    app[route.method](route.path, (res: HttpResponse, req: HttpRequest) => {
      const params = Array.from({ length: paramCount }, (_, i) => req.getParameter(i) ?? '');
      const ctx = new RequestContext(res, req);
      void (async () => {
        try {
          await route.handle(ctx, deps, params);
        } catch (err) {
          ctx.fail(err);
        }
      })();
    });
    allow.set(route.path, [...(allow.get(route.path) ?? []), route.method.toUpperCase()]);
  }
  for (const [path, methods] of allow) {
    app.any(path, (res, req) => {
      const ctx = new RequestContext(res, req);
      const list = methods.join(', ');
      ctx.fail(new HttpError(405, 'method_not_allowed', 'SLABSERVE_METHOD_NOT_ALLOWED', `${ctx.method} is not allowed on ${ctx.url}; use ${list}`, { allow: list }));
    });
  }
  app.any('/*', (res, req) => {
    const ctx = new RequestContext(res, req);
    ctx.fail(new HttpError(404, 'not_found', 'SLABSERVE_ROUTE_NOT_FOUND', `no route ${ctx.method} ${ctx.url}`));
  });
}

async function handleInference(ctx: RequestContext, deps: RouteDeps, task: Task, route: string, pathModel: string | undefined): Promise<void> {
  let modelName = pathModel ?? 'unknown';
  try {
    if (!deps.ready()) throw new NotReadyError();
    const raw = await ctx.readPayload(deps.limits.maxBodyBytes);
    const body = task === 'embed' ? parseBody(EmbedRequest, raw) : parseBody(PredictRequest, raw);
    if (pathModel !== undefined && body.model !== undefined && body.model !== pathModel) {
      throw new ValidationError(`the path names model "${pathModel}" but the body names "${body.model}"`);
    }
    const count = typeof body.inputs === 'string' ? 1 : body.inputs.length;
    if (count > deps.limits.maxClientBatchSize) {
      throw new ValidationError(`${count} inputs exceed the limit of ${deps.limits.maxClientBatchSize} per request (--max-client-batch-size)`);
    }
    const model = deps.client.resolve(task, pathModel ?? body.model);
    modelName = model.plan.spec.name;
    deps.metrics.inputs.inc({ model: modelName, route }, count);

    const tokenizeStart = nowMs();
    const encodings = await deps.client.encode(model, body.inputs, body.truncate ?? false);
    const tokenizeMs = nowMs() - tokenizeStart;
    const call = { signal: ctx.abort.signal };
    let payload: unknown;
    let timing: Timing;
    if (task === 'embed') {
      const r = await deps.client.embed(model, encodings, { ...call, ...((body as EmbedRequest).normalize !== undefined ? { normalize: (body as EmbedRequest).normalize! } : {}) });
      payload = r.vectors.map((v) => Array.from(v));
      timing = r.timing;
    } else {
      const r = await deps.client.classify(model, encodings, call);
      const lists = r.classes.map((c) => scores(model, c, (body as PredictRequest).raw_scores ?? false));
      payload = typeof body.inputs === 'string' ? lists[0] : lists;
      timing = r.timing;
    }
    const totalMs = performance.now() - ctx.startedAt;
    deps.metrics.queueDuration.observe({ model: modelName }, timing.queueMs / 1000);
    ctx.send(200, payload, {
      'x-tokenization-time': ms(tokenizeMs),
      'x-queue-time': ms(timing.queueMs),
      'x-inference-time': ms(timing.inferenceMs),
      'x-total-time': ms(totalMs),
    });
    deps.metrics.requestDuration.observe({ model: modelName, route, status: '200' }, totalMs / 1000);
  } catch (err) {
    const status = statusOf(err);
    deps.metrics.failures.inc({ reason: (err as { type?: string }).type ?? 'backend' });
    deps.metrics.requestDuration.observe({ model: modelName, route, status: String(status) }, (performance.now() - ctx.startedAt) / 1000);
    ctx.fail(err);
  }
}

/** [{label, score}] sorted by score, highest first: probabilities, or logits with raw_scores. */
function scores(model: ClientModel, c: { probabilities: Float32Array; logits: Float32Array }, raw: boolean): { label: string; score: number }[] {
  const values = raw ? c.logits : c.probabilities;
  return model.plan.spec.labels.map((label, i) => ({ label, score: values[i]! })).sort((a, b) => b.score - a.score);
}

const ms = (v: number) => String(Math.round(v * 1000) / 1000);
