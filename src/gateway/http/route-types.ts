/**
 * What a route table is made of (routes.ts and each dialect's table import
 * these, never each other's modules).
 */
import type { Gate, RouteAccess } from '../gate.js';
import type { RequestContext } from './request-context.js';
import type { ServeDeps } from '../serving.js';
import type { RepositoryAnswer, RepositoryOp } from '../../shared/repository-protocol.js';

export interface RouteDeps extends ServeDeps {
  /** The /info document. */
  info(): unknown;
  /** Prometheus text for the whole process. */
  scrape(): Promise<string>;
  /** A model repository operation, done by the main thread (src/main/repository/repository.ts). */
  repository(op: RepositoryOp): Promise<RepositoryAnswer>;
  /** slabserve's version (KServe's server metadata); else the /info document's. */
  version?: string;
  /** Head size, connections and API key, checked before every route; ends every request (access log). */
  gate: Gate;
}

/** One route: a method, a uWS path pattern, and its handler (`params` are the pattern's :parts in order). */
export interface Route {
  method: 'get' | 'post';
  path: string;
  handle(ctx: RequestContext, deps: RouteDeps, params: string[]): void | Promise<void>;
  /** Who may call it (default 'key': a valid API key, when keys are configured). */
  access?: RouteAccess;
  /** Answers an error in the route's dialect (OpenAI's, KServe's shape); default ours. */
  fail?: (ctx: RequestContext, err: unknown) => unknown;
  /** A health probe or metrics scrape: asked every few seconds by machines, so no access line unless --log-probes. */
  probe?: true;
}
