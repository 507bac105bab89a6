/**
 * The model repository's protocol between threads: what a gateway thread asks
 * the main thread (src/main/repository/repository.ts) and what it answers, as
 * plain data (errors do not cross threads).
 */
import type { ErrorType } from './errors.js';
import type { ServeSettings } from './model-format/model-config.js';

/** A model's state in the index, as Triton names them. */
export type ModelState = 'READY' | 'UNAVAILABLE' | 'LOADING' | 'UNLOADING';

/** One row of POST /v2/repository/index. */
export interface IndexEntry {
  name: string;
  /** The served version's generation: 1 at the first load, one more at each reload. */
  version?: string;
  state: ModelState;
  /** Why it is UNAVAILABLE: the last load's failure, or "unloaded". */
  reason: string;
}

/** What a gateway asks the main thread for (its routes: src/gateway/repository/http.ts, src/gateway/kserve/grpc.ts). */
export type RepositoryOp =
  | { op: 'index'; ready?: boolean }
  | { op: 'load'; name: string; config?: ServeSettings }
  | { op: 'unload'; name: string }
  /** Lazy loading: load it unless it is served; requests asking meanwhile share that load. */
  | { op: 'ensure'; name: string }
  /** The models served and how each is found again (a cluster's restarted process starts with them); not a route. */
  | { op: 'served' };

/** A model served, and the --model value that finds it again: its name, its folder's path, or its Hub id at the commit served. */
export interface ServedSource {
  name: string;
  given: string;
}

/** The answer, as plain data (errors do not cross threads): the index, or the error's message, code and type. */
export type RepositoryAnswer = { ok: true; index?: IndexEntry[]; served?: ServedSource[] } | { ok: false; message: string; code: string; type: ErrorType };
