/**
 * The HTTP API of one gateway thread. Routes (JSON by default; msgpack with
 * Content-Type / Accept application/msgpack):
 *
 *   POST /embed                    {inputs, normalize?, truncate?, model?, embedding_type?, chunks?} -> number[][] (quantized: integer lists; chunks: a row each)
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
 * Beside them (DEFAULT_ROUTES): TEI's /rerank, /tokenize, /decode (src/gateway/tei/http.ts), OpenAI's
 * /v1/embeddings and /v1/models (src/gateway/openai/http.ts), KServe v2 / Triton's /v2/... (src/gateway/kserve/http.ts)
 * and Triton's model repository extension, /v2/repository/... (src/gateway/repository/http.ts).
 *
 * Responses carry x-queue-time, x-inference-time, x-tokenization-time and
 * x-total-time (ms), as text-embeddings-inference sends them.
 */
import type { RouteAccess } from '../gate.js';
import { HttpError } from '../../shared/errors.js';
import { RequestContext } from './request-context.js';
import { cohereRoutes } from '../cohere/http.js';
import { kserveRoutes } from '../kserve/http.js';
import { openaiRoutes } from '../openai/http.js';
import { REPOSITORY_ROUTES } from '../repository/http.js';
import { teiRoutes } from '../tei/http.js';
import { vllmRoutes } from '../vllm/http.js';
import type { Route, RouteDeps } from './route-types.js';
import { ourFail, serveInference } from '../serving.js';
import { embedEndpoint, predictEndpoint } from '../tei/endpoints.js';
import type { HttpRequest, HttpResponse, TemplatedApp } from '../uws.js';

export type { GatewayLimits } from '../serving.js';
export type { Route, RouteDeps } from './route-types.js';

const PROMETHEUS_TYPE = 'text/plain; version=0.0.4; charset=utf-8';


/** The core API: TEI-style /embed and /predict, health, info, metrics. */
export const coreRoutes: Route[] = [
  { method: 'post', path: '/embed', handle: (ctx, deps) => serveInference(ctx, deps, embedEndpoint) },
  { method: 'post', path: '/predict', handle: (ctx, deps) => serveInference(ctx, deps, predictEndpoint) },
  { method: 'post', path: '/models/:name/embed', handle: (ctx, deps, params) => serveInference(ctx, deps, embedEndpoint, ourFail, params) },
  { method: 'post', path: '/models/:name/predict', handle: (ctx, deps, params) => serveInference(ctx, deps, predictEndpoint, ourFail, params) },
  { method: 'get', path: '/info', handle: (ctx, deps) => ctx.send(200, deps.info()) },
  { method: 'get', path: '/livez', access: 'open', probe: true, handle: (ctx) => ctx.send(200, { status: 'alive' }) },
  { method: 'get', path: '/readyz', access: 'open', probe: true, handle: (ctx, deps) => readiness(ctx, deps) },
  { method: 'get', path: '/health', access: 'open', probe: true, handle: (ctx, deps) => readiness(ctx, deps) },
  { method: 'get', path: '/metrics', access: 'metrics', probe: true, handle: async (ctx, deps) => ctx.write(200, PROMETHEUS_TYPE, await deps.scrape()) },
];

function readiness(ctx: RequestContext, deps: RouteDeps): void {
  if (deps.ready()) ctx.send(200, { status: 'ready' });
  else ctx.send(503, { status: 'not ready', error: 'warming up, inference thread not answering, or draining', error_type: 'Unhealthy', type: 'unavailable' });
}

/**
 * Every route a gateway serves: the core API, then the rest of TEI's
 * (src/gateway/tei/http.ts), OpenAI's embeddings (src/gateway/openai/http.ts), Cohere's and
 * Jina's rerank and Cohere's embed (src/gateway/cohere/http.ts), vLLM's /score and /classify
 * (src/gateway/vllm/http.ts) and KServe v2 / Triton's
 * inference protocol (src/gateway/kserve/http.ts).
 */
export const DEFAULT_ROUTES: readonly Route[] = [...coreRoutes, ...teiRoutes, ...openaiRoutes, ...cohereRoutes, ...vllmRoutes, ...kserveRoutes, ...REPOSITORY_ROUTES];

/**
 * Registers `routes`, then a 405 (with Allow) for every known path asked with
 * another method, then a 404 for everything else. Every request passes the
 * gate first (head size, connections, API key); the 405 and 404 answers too,
 * so a client without a key learns nothing about the routes.
 */
export function registerRoutes(app: TemplatedApp, deps: RouteDeps, routes: readonly Route[] = DEFAULT_ROUTES): void {
  const gate = deps.gate;
  const allow = new Map<string, { methods: string[]; access: RouteAccess }>();
  for (const route of routes) {
    const paramCount = (route.path.match(/\/:/g) ?? []).length;
    const access = route.access ?? 'key';
    const fail = route.fail ?? ourFail;
    const probe = route.probe === true;
    app[route.method](route.path, (res: HttpResponse, req: HttpRequest) => {
      const ctx = new RequestContext(res, req, gate, route.path);
      ctx.probe = probe;
      if (!gate.admit(ctx, req, access, fail)) return;
      const params = paramCount === 0 ? NO_PARAMS : Array.from({ length: paramCount }, (_, i) => req.getParameter(i) ?? '');
      try {
        const p = route.handle(ctx, deps, params);
        if (p) p.catch((err: unknown) => fail(ctx, err));
      } catch (err) {
        fail(ctx, err);
      }
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
