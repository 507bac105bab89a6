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
 * With API keys (--api-key), every route needs one (`Authorization: Bearer <key>`)
 * except /livez, /readyz, /health, KServe's /v2/health/*, and /metrics unless
 * --metrics-auth; the gate (gate.ts) checks it, and the request head's size and
 * the gateway's connections, before a route runs.
 *
 * Beside them (defaultRoutes): TEI's /rerank, /tokenize, /decode (routes-tei.ts), OpenAI's
 * /v1/embeddings and /v1/models (routes-openai.ts), KServe v2 / Triton's /v2/... (routes-kserve.ts).
 *
 * Responses carry x-queue-time, x-inference-time, x-tokenization-time and
 * x-total-time (ms), as text-embeddings-inference sends them.
 */
import type { GatewayMetrics } from '../shared/metrics.js';
import type { Gate, RouteAccess } from './gate.js';
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
  /** Head size, connections and API key, checked before every route; ends every request (access log). */
  gate: Gate;
}

const PROMETHEUS_TYPE = 'text/plain; version=0.0.4; charset=utf-8';

/** One route: a method, a uWS path pattern, and its handler (`params` are the pattern's :parts in order). */
export interface Route {
  method: 'get' | 'post';
  path: string;
  handle(ctx: RequestContext, deps: RouteDeps, params: string[]): void | Promise<void>;
  /** Who may call it (default 'key': a valid API key, when keys are configured). */
  access?: RouteAccess;
  /** Answers an error in the route's dialect (OpenAI's, KServe's shape); default ours. */
  fail?: (ctx: RequestContext, err: unknown) => void;
}

const ourFail = (ctx: RequestContext, err: unknown) => ctx.fail(err);

/** The core API: TEI-style /embed and /predict, health, info, metrics. */
export const coreRoutes: Route[] = [
  { method: 'post', path: '/embed', handle: (ctx, deps) => serveOperation(ctx, deps, embedOperation, { route: '/embed', inference: true, task: 'embed' }) },
  { method: 'post', path: '/predict', handle: (ctx, deps) => serveOperation(ctx, deps, predictOperation, { route: '/predict', inference: true, task: 'classify' }) },
  {
    method: 'post',
    path: '/models/:name/embed',
    handle: (ctx, deps, [name]) => serveOperation(ctx, deps, embedOperation, { route: '/embed', inference: true, task: 'embed', pathModel: name! }),
  },
  {
    method: 'post',
    path: '/models/:name/predict',
    handle: (ctx, deps, [name]) => serveOperation(ctx, deps, predictOperation, { route: '/predict', inference: true, task: 'classify', pathModel: name! }),
  },
  { method: 'get', path: '/info', handle: (ctx, deps) => ctx.send(200, deps.info()) },
  { method: 'get', path: '/livez', access: 'open', handle: (ctx) => ctx.send(200, { status: 'alive' }) },
  { method: 'get', path: '/readyz', access: 'open', handle: (ctx, deps) => readiness(ctx, deps) },
  { method: 'get', path: '/health', access: 'open', handle: (ctx, deps) => readiness(ctx, deps) },
  { method: 'get', path: '/metrics', access: 'metrics', handle: async (ctx, deps) => ctx.write(200, PROMETHEUS_TYPE, await deps.scrape()) },
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
 * another method, then a 404 for everything else. Every request passes the
 * gate first (head size, connections, API key); the 405 and 404 answers too,
 * so a client without a key learns nothing about the routes.
 */
export function registerRoutes(app: TemplatedApp, deps: RouteDeps, routes: Route[] = defaultRoutes()): void {
  const gate = deps.gate;
  const allow = new Map<string, { methods: string[]; access: RouteAccess }>();
  for (const route of routes) {
    const paramCount = (route.path.match(/\/:/g) ?? []).length;
    const access = route.access ?? 'key';
    const fail = route.fail ?? ourFail;
    app[route.method](route.path, (res: HttpResponse, req: HttpRequest) => {
      const ctx = new RequestContext(res, req, gate, route.path);
      if (!gate.admit(ctx, req, access, fail)) return;
      const params = paramCount === 0 ? NO_PARAMS : Array.from({ length: paramCount }, (_, i) => req.getParameter(i) ?? '');
      void (async () => {
        try {
          await route.handle(ctx, deps, params);
        } catch (err) {
          fail(ctx, err);
        }
      })();
    });
    const known = allow.get(route.path);
    allow.set(route.path, { methods: [...(known?.methods ?? []), route.method.toUpperCase()], access: known?.access === 'open' ? 'open' : access });
  }
  for (const [path, { methods, access }] of allow) {
    app.any(path, (res, req) => {
      const ctx = new RequestContext(res, req, gate, path);
      if (!gate.admit(ctx, req, access, ourFail)) return;
      const list = methods.join(', ');
      ctx.fail(new HttpError(405, 'method_not_allowed', 'SLABSERVE_METHOD_NOT_ALLOWED', `${ctx.method} is not allowed on ${ctx.url}; use ${list}`, { allow: list }));
    });
  }
  app.any('/*', (res, req) => {
    const ctx = new RequestContext(res, req, gate, 'unmatched');
    if (!gate.admit(ctx, req, 'key', ourFail)) return;
    ctx.fail(new HttpError(404, 'not_found', 'SLABSERVE_ROUTE_NOT_FOUND', `no route ${ctx.method} ${ctx.url}`));
  });
}

const NO_PARAMS: string[] = [];
