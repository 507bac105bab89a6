/**
 * Triton's model repository extension over HTTP (docs/model-repository.md):
 *
 *   POST /v2/repository/index                 {ready?}  -> [{name, version?, state, reason}]
 *   POST /v2/repository/models/{name}/load    {parameters?: {config?}} -> 200 once it takes requests
 *                                             ({name}: a folder's name, or a Hub id percent-encoded: ORG%2FNAME)
 *   POST /v2/repository/models/{name}/unload  {parameters?: {unload_dependents?}} -> 200
 *
 * A body is optional. With --api-key they need a key, and with --admin-api-key one of its keys
 * (the API keys then do not open them). The work happens on the main thread (src/main/repository/repository.ts),
 * asked over RPC; failures answer Triton's `{error: message}` with 400, and 503
 * when the server could not finish a load (the inference thread died meanwhile).
 */
import { SlabserveError, ValidationError } from '../../shared/errors.js';
import type { RepositoryAnswer, RepositoryOp } from '../../shared/repository-protocol.js';
import type { ServeSettings } from '../../shared/model-format/model-config.js';
import type { RequestContext } from '../http/request-context.js';
import type { Route, RouteDeps } from '../http/route-types.js';
import { parseBody, RepositoryIndexRequest, RepositoryLoadRequest, RepositoryUnloadRequest, ServeSettingsSchema } from '../schemas.js';

/** Bodies here are small: a config at most. */
const MAX_BODY_BYTES = 1 << 20;

/** Triton's `{error}`; a refused or failed operation (and a bad body) is its 400, the rest keep our statuses (401, 413, 503, ...). */
const fail = (ctx: RequestContext, err: unknown) => ctx.fail(err, (info) => ({ error: info.message }), (info) => (info.type === 'validation' ? 400 : info.status));

/** Sends `op` to the main thread and answers: `ok(answer)` on success, the error otherwise. */
async function ask(ctx: RequestContext, deps: RouteDeps, op: RepositoryOp, ok: (a: RepositoryAnswer & { ok: true }) => void): Promise<void> {
  const a = await deps.repository(op);
  if (a.ok) ok(a);
  else fail(ctx, new SlabserveError(a.message, a.code, a.type));
}

/** The body of a load's `parameters.config`: serve.json's fields, as an object or a JSON string. */
export function serveSettings(config: string | Record<string, unknown> | undefined): ServeSettings | undefined {
  if (config === undefined) return undefined;
  let value: unknown = config;
  if (typeof config === 'string') {
    try {
      value = JSON.parse(config);
    } catch (err) {
      throw new ValidationError(`parameters.config is not valid JSON: ${(err as Error).message}`);
    }
  }
  return parseBody(ServeSettingsSchema, value) as ServeSettings;
}

export const REPOSITORY_ROUTES: readonly Route[] = [
  {
    method: 'post',
    path: '/v2/repository/index',
    access: 'admin',
    fail,
    handle: async (ctx, deps) => {
      const body = parseBody(RepositoryIndexRequest, (await ctx.readPayload(MAX_BODY_BYTES, { emptyOk: true })) ?? {});
      await ask(ctx, deps, { op: 'index', ...(body.ready !== undefined ? { ready: body.ready } : {}) }, (a) => ctx.send(200, a.index));
    },
  },
  {
    method: 'post',
    path: '/v2/repository/models/:name/load',
    access: 'admin',
    fail,
    handle: async (ctx, deps, [name]) => {
      const body = parseBody(RepositoryLoadRequest, (await ctx.readPayload(MAX_BODY_BYTES, { emptyOk: true })) ?? {});
      const config = serveSettings(body.parameters?.config);
      await ask(ctx, deps, { op: 'load', name: decodedName(name!), ...(config ? { config } : {}) }, () => ctx.send(200, {}));
    },
  },
  {
    method: 'post',
    path: '/v2/repository/models/:name/unload',
    access: 'admin',
    fail,
    handle: async (ctx, deps, [name]) => {
      parseBody(RepositoryUnloadRequest, (await ctx.readPayload(MAX_BODY_BYTES, { emptyOk: true })) ?? {});
      await ask(ctx, deps, { op: 'unload', name: name! }, () => ctx.send(200, {}));
    },
  },
];

/** A path segment's name: a Hub id comes percent-encoded (BAAI%2Fbge-small-en-v1.5%40v1); one that does not decode stays as sent. */
function decodedName(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch {
    return segment;
  }
}
