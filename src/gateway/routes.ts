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
 * Beside them (defaultRoutes): TEI's /rerank, /tokenize, /decode (routes-tei.ts), OpenAI's
 * /v1/embeddings and /v1/models (routes-openai.ts), KServe v2 / Triton's /v2/... (routes-kserve.ts).
 *
 * Responses carry x-queue-time, x-inference-time, x-tokenization-time and
 * x-total-time (ms), as text-embeddings-inference sends them.
 */
import type { GatewayMetrics } from '../shared/metrics.js';
import type { InferenceClient } from './inference-client.js';
import { HttpError, RequestContext } from './http.js';
import { embedOperation, predictOperation } from './operations.js';
import { serveOperation } from './route-util.js';
import { kserveRoutes } from './routes-kserve.js';
import { openaiRoutes } from './routes-openai.js';
import { teiRoutes } from './routes-tei.js';
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
  /** slabserve's version (KServe's server metadata); else the /info document's. */
  version?: string;
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
  { method: 'post', path: '/embed', handle: (ctx, deps) => serveOperation(ctx, deps, embedOperation, { route: '/embed', inference: true }) },
  { method: 'post', path: '/predict', handle: (ctx, deps) => serveOperation(ctx, deps, predictOperation, { route: '/predict', inference: true }) },
  {
    method: 'post',
    path: '/models/:name/embed',
    handle: (ctx, deps, [name]) => serveOperation(ctx, deps, embedOperation, { route: '/embed', inference: true, pathModel: name! }),
  },
  {
    method: 'post',
    path: '/models/:name/predict',
    handle: (ctx, deps, [name]) => serveOperation(ctx, deps, predictOperation, { route: '/predict', inference: true, pathModel: name! }),
  },
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
 * Every route a gateway serves: the core API, then the rest of TEI's
 * (routes-tei.ts), OpenAI's embeddings (routes-openai.ts) and KServe v2 /
 * Triton's inference protocol (routes-kserve.ts). A function, not a
 * constant: those modules import this one's types, and a default parameter
 * is only evaluated when called.
 */
export function defaultRoutes(): Route[] {
  return [...coreRoutes, ...teiRoutes, ...openaiRoutes, ...kserveRoutes];
}

/**
 * Registers `routes`, then a 405 (with Allow) for every known path asked with
 * another method, then a 404 for everything else.
 */
export function registerRoutes(app: TemplatedApp, deps: RouteDeps, routes: Route[] = defaultRoutes()): void {
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
