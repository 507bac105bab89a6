/**
 * A model by its Hub id, into the Hugging Face cache and out as a folder to
 * serve: the revision resolved to its commit, the repository listed, the
 * files the model needs picked (pick-files.ts), each fetched once
 * (download.ts), the revision's ref written last. Offline (HF_HUB_OFFLINE),
 * or with the Hub out of reach, the cache alone answers.
 *
 * The official client (@huggingface/hub) asks the Hub what there is: the
 * revision's commit (modelInfo) and the listing with sizes and hashes
 * (listFiles). The bytes are fetched here, as huggingface_hub fetches them:
 * the client's cache download names the snapshot after each file's last
 * commit rather than the revision's, writes no refs, takes no lock, neither
 * resumes nor checks a hash, has no offline mode, and sends the token on to
 * a CDN that answers as CloudFront.
 */
import { HubApiError, listFiles, modelInfo } from '@huggingface/hub';
import type { ReadableStream } from 'node:stream/web';
import type { ModelOverrides } from '../../shared/model-format/model-config.js';
import { RepoCache } from './cache.js';
import { downloadFile, type RepoFile } from './download.js';
import type { HfEnv } from './hf-env.js';
import { COMMIT, hubIdText, shortNameOf, type HubModelId } from './hub-id.js';
import { pickFiles } from './pick-files.js';

export interface FetchedModel {
  id: HubModelId;
  commit: string;
  /** The snapshot folder: serve it as a local folder. */
  dir: string;
  /** The files fetched or found, relative to `dir`. */
  files: string[];
  /** Whether the Hub was asked (false: the cache alone answered). */
  online: boolean;
}

/** How a fetch reports the files it downloads: a bar on a terminal, a log line per file elsewhere (progress.ts). */
export interface FetchProgress {
  start(file: string, size: number, from: number): void;
  update(file: string, received: number): void;
  done(file: string, size: number): void;
}

export interface FetchOptions {
  env: HfEnv;
  /** Which graph (dtype, CUDA): as a local folder would be read. */
  overrides: ModelOverrides;
  log: (line: string) => void;
  progress?: FetchProgress;
  /** Tries of a Hub call that fails on the network or with 429/5xx; default 5. */
  tries?: number;
  /** Waits before try `attempt` (2, 3, ...); default 2^(attempt-2) seconds. */
  backoff?: (attempt: number) => Promise<void>;
}

/** Why a Hub model cannot be served, in words an operator acts on. */
export class HubModelError extends Error {}

export async function fetchModel(id: HubModelId, opts: FetchOptions): Promise<FetchedModel> {
  const cache = new RepoCache(opts.env.cacheDir, id.repo);
  if (opts.env.offline) return fromCache(id, cache, opts, 'HF_HUB_OFFLINE is set');
  // A commit never changes: what the cache holds of it is served without asking (as huggingface_hub does).
  const pinned = COMMIT.test(id.revision) ? cachedSnapshot(id, cache, opts) : null;
  if (pinned && typeof pinned !== 'string') return pinned;
  const hub = new HubCalls(id, opts);
  let listing: { commit: string; files: RepoFile[] };
  try {
    listing = await hub.listing();
  } catch (err) {
    if (!(err instanceof HubUnreachableError)) throw err;
    opts.log(`slabserve: warning: ${err.message}; serving ${hubIdText(id)} from the cache`);
    return fromCache(id, cache, opts, err.message);
  }
  const where = `${hubIdText(id)} (commit ${listing.commit})`;
  const { files } = pickFiles(listing.files.map((f) => f.path), where, shortNameOf(id.repo), opts.overrides);
  for (const path of files) {
    const file = listing.files.find((f) => f.path === path)!;
    if (cache.has(listing.commit, file.path)) continue;
    await downloadFile(cache, listing.commit, file, {
      open: (offset) => hub.open(listing.commit, file, offset),
      onStart: (from) => opts.progress?.start(file.path, file.size, from),
      onProgress: (received) => opts.progress?.update(file.path, received),
      backoff: opts.backoff ?? defaultBackoff,
    });
    opts.progress?.done(file.path, file.size);
  }
  cache.writeRef(id.revision, listing.commit);
  return { id, commit: listing.commit, dir: cache.snapshotDir(listing.commit), files, online: true };
}

/** The cached snapshot of `id`'s revision, when it holds what the model needs; else throws why not. */
function fromCache(id: HubModelId, cache: RepoCache, opts: FetchOptions, why: string): FetchedModel {
  const found = cachedSnapshot(id, cache, opts);
  if (typeof found !== 'string') return found;
  throw new HubModelError(`model ${hubIdText(id)}: ${why}, and ${found}`);
}

/** The cached snapshot of `id`'s revision with what the model needs, or why there is none. */
function cachedSnapshot(id: HubModelId, cache: RepoCache, opts: FetchOptions): FetchedModel | string {
  const text = hubIdText(id);
  const commit = COMMIT.test(id.revision) ? id.revision : cache.readRef(id.revision);
  if (!commit) return `the cache (${opts.env.cacheDir}) has never fetched revision ${id.revision} of it: fetch it first (slabserve download ${text})`;
  try {
    const { files } = pickFiles(cache.snapshotFiles(commit), `the cached ${text} (commit ${commit}, ${cache.snapshotDir(commit)})`, shortNameOf(id.repo), opts.overrides);
    return { id, commit, dir: cache.snapshotDir(commit), files, online: false };
  } catch (err) {
    return (err as Error).message;
  }
}

class HubUnreachableError extends Error {}

const RETRIED = new Set([408, 429, 500, 502, 503, 504]);
const MAX_REDIRECTS = 5;
const defaultBackoff = (attempt: number) => new Promise<void>((r) => setTimeout(r, 1000 * 2 ** (attempt - 2)));

/** The Hub's side of one model: calls through the official client, with its errors worded and its transient failures retried. */
class HubCalls {
  /** The X-Error-Code of the latest failed answer: the client keeps the status but not this header. */
  private errorCode: string | null = null;
  private readonly base: { hubUrl: string; accessToken?: string; fetch: typeof fetch };

  constructor(
    private readonly id: HubModelId,
    private readonly opts: FetchOptions,
  ) {
    const recording: typeof fetch = async (input, init) => {
      const res = await fetch(input, init);
      if (!res.ok) this.errorCode = res.headers.get('x-error-code');
      return res;
    };
    this.base = { hubUrl: opts.env.endpoint, ...(opts.env.token ? { accessToken: opts.env.token } : {}), fetch: recording };
  }

  /** The revision's commit and every file at it. */
  async listing(): Promise<{ commit: string; files: RepoFile[] }> {
    const { repo, revision } = this.id;
    const info = await this.call(() => modelInfo({ ...this.base, name: repo, revision, additionalFields: ['sha'] }));
    const commit = info.sha;
    const files: RepoFile[] = [];
    await this.call(async () => {
      files.length = 0;
      for await (const f of listFiles({ ...this.base, repo, revision: commit, recursive: true })) {
        if (f.type !== 'file') continue;
        const etag = f.lfs?.oid ?? f.oid;
        if (!etag) throw new HubModelError(`model ${hubIdText(this.id)}: the Hub's listing gives ${f.path} no hash`);
        files.push({ path: f.path, size: f.lfs?.size ?? f.size, etag, lfs: f.lfs !== undefined });
      }
    });
    return { commit, files };
  }

  /**
   * `file`'s bytes from `offset` on, as huggingface_hub fetches them: the Hub's resolve route, its
   * redirects followed here so the token goes to the Hub's own host only (never to a CDN).
   */
  open(commit: string, file: RepoFile, offset: number): Promise<{ body: ReadableStream<Uint8Array>; from: number }> {
    const path = file.path.split('/').map(encodeURIComponent).join('/');
    return this.call(() => this.get(new URL(`${this.opts.env.endpoint}/${this.id.repo}/resolve/${commit}/${path}`), offset));
  }

  private async get(start: URL, offset: number): Promise<{ body: ReadableStream<Uint8Array>; from: number }> {
    const hub = new URL(this.opts.env.endpoint).origin;
    const token = this.opts.env.token;
    let url = start;
    for (let hop = 0; hop <= MAX_REDIRECTS; hop++) {
      const headers: Record<string, string> = { 'accept-encoding': 'identity' };
      if (offset > 0) headers['range'] = `bytes=${offset}-`;
      if (token && url.origin === hub) headers['authorization'] = `Bearer ${token}`;
      const res = await fetch(url, { headers, redirect: 'manual' });
      const location = res.headers.get('location');
      if (res.status >= 300 && res.status < 400 && location) {
        await res.body?.cancel();
        url = new URL(location, url);
        continue;
      }
      if (!res.ok) {
        this.errorCode = res.headers.get('x-error-code');
        await res.body?.cancel();
        throw new HubApiError(url.href, res.status, res.headers.get('x-request-id') ?? undefined, `${res.status} ${res.statusText}`);
      }
      if (!res.body) throw new Error(`${url.href} answered ${res.status} with no body`);
      // A server that ignores the range sends the whole file (200): it starts again from 0.
      return { body: res.body as unknown as ReadableStream<Uint8Array>, from: res.status === 206 ? offset : 0 };
    }
    throw new Error(`${start.href}: more than ${MAX_REDIRECTS} redirects`);
  }

  /** `fn`, tried again on the network's failures and the Hub's 408/429/5xx; other errors worded for an operator. */
  private async call<T>(fn: () => Promise<T>): Promise<T> {
    const tries = this.opts.tries ?? 5;
    for (let attempt = 1; ; attempt++) {
      try {
        this.errorCode = null;
        return await fn();
      } catch (err) {
        const transient = err instanceof HubApiError ? RETRIED.has(err.statusCode) : !(err instanceof HubModelError);
        if (!transient) throw err instanceof HubApiError ? this.worded(err) : err;
        if (attempt >= tries) {
          const what = err instanceof HubApiError ? `it answered ${err.statusCode}` : (err as Error).message;
          throw new HubUnreachableError(`the Hub at ${this.opts.env.endpoint} failed ${tries} times (${what})`);
        }
        await (this.opts.backoff ?? defaultBackoff)(attempt + 1);
      }
    }
  }

  private worded(err: HubApiError): HubModelError {
    const { repo, revision } = this.id;
    const page = `${this.opts.env.endpoint}/${repo}`;
    const token = this.opts.env.token ? `the token from ${this.opts.env.tokenSource}` : 'no token (set HF_TOKEN)';
    const code = this.errorCode;
    const text = hubIdText(this.id);
    if (code === 'GatedRepo') return new HubModelError(`model ${text} is gated: request access at ${page}, then set HF_TOKEN to a token of an account that has it (sent: ${token})`);
    if (code === 'RevisionNotFound') return new HubModelError(`model ${text}: ${repo} has no revision "${revision}" (a branch, tag or commit: ${page})`);
    if (code === 'RepoNotFound' || err.statusCode === 401 || err.statusCode === 404) {
      return new HubModelError(`model ${text}: the Hub at ${this.opts.env.endpoint} has no repository ${repo}, or it is private and ${token} gives no access to it`);
    }
    if (err.statusCode === 403) return new HubModelError(`model ${text}: the Hub refused access to ${repo} with ${token} (403): ${err.message}`);
    return new HubModelError(`model ${text}: the Hub answered ${err.statusCode}: ${err.message}`);
  }
}
