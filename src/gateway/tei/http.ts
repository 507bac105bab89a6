/**
 * The rest of text-embeddings-inference's HTTP API, beside the core routes'
 * /embed and /predict (which also take pre-tokenized inputs):
 *
 *   POST /embed_sparse {inputs, truncate?, truncation_direction?, prompt_name?, model?} -> per input [{index, value}]:
 *                   a SPLADE model's non-zero weights by token id (424 for a model without a sparse output)
 *   POST /embed_all {inputs, truncate?, truncation_direction?, prompt_name?, model?} -> per input, per token, its vector
 *                   (the token states; 424 for a model without token vectors)
 *   POST /rerank    {query, texts, raw_scores?, return_text?, truncate?, model?} -> [{index, score, text?}], best first
 *   POST /similarity {inputs: {source_sentence, sentences}, parameters?: {truncate?, truncation_direction?, prompt_name?}, model?}
 *                   -> number[]: each sentence's cosine similarity to the source
 *   POST /tokenize  {inputs, add_special_tokens? (true), model?}  -> per input [{id, text, special, start, stop}]
 *   POST /decode    {ids, skip_special_tokens? (true), model?}     -> string, or string[] for a list of id lists
 *   POST /          the body of /embed, /predict, /rerank or /similarity, answered by the task of the model named (or the first)
 *   POST /models/{name}/embed_sparse, /embed_all, /rerank, /similarity, /tokenize, /decode: the model named in the path
 *
 * The endpoints are tei.ts's (the WebSocket API serves them too). Errors are
 * TEI's `{error, error_type}` with our `type` and `code` beside them.
 */
import type { Route } from '../http/route-types.js';
import { ourFail, serveInference, serveLocal } from '../serving.js';
import { decodeEndpoint, embedAllEndpoint, embedSparseEndpoint, rerankEndpoint, rootEndpoint, similarityEndpoint, tokenizeEndpoint } from './endpoints.js';

export const teiRoutes: Route[] = [
  { method: 'post', path: '/', handle: (ctx, deps) => serveInference(ctx, deps, rootEndpoint) },
  { method: 'post', path: '/embed_sparse', handle: (ctx, deps) => serveInference(ctx, deps, embedSparseEndpoint) },
  { method: 'post', path: '/embed_all', handle: (ctx, deps) => serveInference(ctx, deps, embedAllEndpoint) },
  { method: 'post', path: '/rerank', handle: (ctx, deps) => serveInference(ctx, deps, rerankEndpoint) },
  { method: 'post', path: '/similarity', handle: (ctx, deps) => serveInference(ctx, deps, similarityEndpoint) },
  { method: 'post', path: '/tokenize', handle: (ctx, deps) => serveLocal(ctx, deps, tokenizeEndpoint) },
  { method: 'post', path: '/decode', handle: (ctx, deps) => serveLocal(ctx, deps, decodeEndpoint) },
  { method: 'post', path: '/models/:name/embed_sparse', handle: (ctx, deps, params) => serveInference(ctx, deps, embedSparseEndpoint, ourFail, params) },
  { method: 'post', path: '/models/:name/embed_all', handle: (ctx, deps, params) => serveInference(ctx, deps, embedAllEndpoint, ourFail, params) },
  { method: 'post', path: '/models/:name/rerank', handle: (ctx, deps, params) => serveInference(ctx, deps, rerankEndpoint, ourFail, params) },
  { method: 'post', path: '/models/:name/similarity', handle: (ctx, deps, params) => serveInference(ctx, deps, similarityEndpoint, ourFail, params) },
  { method: 'post', path: '/models/:name/tokenize', handle: (ctx, deps, params) => serveLocal(ctx, deps, tokenizeEndpoint, ourFail, params) },
  { method: 'post', path: '/models/:name/decode', handle: (ctx, deps, params) => serveLocal(ctx, deps, decodeEndpoint, ourFail, params) },
];
