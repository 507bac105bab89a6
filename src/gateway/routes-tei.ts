/**
 * The rest of text-embeddings-inference's HTTP API, beside the core routes'
 * /embed and /predict (which also take pre-tokenized inputs):
 *
 *   POST /rerank    {query, texts, raw_scores?, return_text?, truncate?, model?} -> [{index, score, text?}], best first
 *   POST /tokenize  {inputs, add_special_tokens? (true), model?}  -> per input [{id, text, special, start, stop}]
 *   POST /decode    {ids, skip_special_tokens? (true), model?}     -> string, or string[] for a list of id lists
 *   POST /models/{name}/rerank, /models/{name}/tokenize, /models/{name}/decode: the model named in the path
 *
 * The work is done by the transport-free operations (src/gateway/operations.ts),
 * so the WebSocket API can answer the same requests. Errors are ours:
 * `{error, type, code}`.
 */
import { decodeOperation, rerankOperation, tokenizeOperation } from './operations.js';
import { serveOperation } from './route-util.js';
import type { Route } from './routes.js';

export const teiRoutes: Route[] = [
  { method: 'post', path: '/rerank', handle: (ctx, deps) => serveOperation(ctx, deps, rerankOperation, { route: '/rerank', inference: true, task: 'rerank' }) },
  { method: 'post', path: '/tokenize', handle: (ctx, deps) => serveOperation(ctx, deps, tokenizeOperation, { route: '/tokenize', inference: false }) },
  { method: 'post', path: '/decode', handle: (ctx, deps) => serveOperation(ctx, deps, decodeOperation, { route: '/decode', inference: false }) },
  {
    method: 'post',
    path: '/models/:name/rerank',
    handle: (ctx, deps, [name]) => serveOperation(ctx, deps, rerankOperation, { route: '/rerank', inference: true, task: 'rerank', pathModel: name! }),
  },
  {
    method: 'post',
    path: '/models/:name/tokenize',
    handle: (ctx, deps, [name]) => serveOperation(ctx, deps, tokenizeOperation, { route: '/tokenize', inference: false, pathModel: name! }),
  },
  {
    method: 'post',
    path: '/models/:name/decode',
    handle: (ctx, deps, [name]) => serveOperation(ctx, deps, decodeOperation, { route: '/decode', inference: false, pathModel: name! }),
  },
];
