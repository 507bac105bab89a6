/**
 * One file of a repository into the cache: under a lock, so processes that
 * want the same blob (a cluster's workers, a restart) download it once;
 * resumed from the bytes already there when the transfer breaks; checked
 * against the size and hash the Hub announced before it becomes a blob; and
 * linked into its snapshot. A file that fails its check is fetched again
 * once from the start; a failure leaves no blob and no link behind.
 */
import { createHash } from 'node:crypto';
import { createReadStream, createWriteStream, existsSync, mkdirSync, renameSync, rmSync, statfsSync, statSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import type { ReadableStream } from 'node:stream/web';
import lockfile from 'proper-lockfile';
import type { RepoCache } from './cache.js';

/** A file of the repository as its listing announces it. */
export interface RepoFile {
  path: string;
  size: number;
  /** Its blob's name in the cache: the LFS sha256, else the git blob id (huggingface_hub's etag). */
  etag: string;
  /** Whether `etag` is a sha256 of the bytes (LFS) rather than a git blob id. */
  lfs: boolean;
}

export interface DownloadOptions {
  /** The file's bytes from `offset` on; `from`: where they start (0 where the server ignored the range). Retries its own failures. */
  open(offset: number): Promise<{ body: ReadableStream<Uint8Array>; from: number }>;
  /** Once, as its transfer begins: from 0, or from the bytes an interrupted one left. */
  onStart?: (from: number) => void;
  /** Bytes of this file received so far. */
  onProgress?: (received: number) => void;
  /** Consecutive breaks without progress before giving up. */
  retries?: number;
  /** Waits before retry `attempt` (1, 2, ...); default a second per attempt. */
  backoff?: (attempt: number) => Promise<void>;
}

export class CorruptDownloadError extends Error {}

const LOCK_STALE_MS = 10_000;

/** `file` of snapshot `commit` in `cache`, fetched unless it is there. Resolves once it is linked. */
export async function downloadFile(cache: RepoCache, commit: string, file: RepoFile, opts: DownloadOptions): Promise<void> {
  if (cache.has(commit, file.path)) return;
  const blob = cache.blobPath(file.etag);
  mkdirSync(join(cache.folder, 'blobs'), { recursive: true });
  mkdirSync(cache.locks, { recursive: true });
  const release = await lockfile.lock(cache.locks, {
    // Beside huggingface_hub's own <etag>.lock file, which its filelock holds open: a folder of our own.
    lockfilePath: join(cache.locks, `${file.etag}.slabserve.lock`),
    // The holder touches it while it downloads; one untouched this long was left by a process that
    // died (a crash, a kill): the next one takes it over and resumes the download.
    stale: LOCK_STALE_MS,
    update: LOCK_STALE_MS / 4,
    retries: { forever: true, minTimeout: 100, maxTimeout: 1_000 },
    realpath: false,
    // Taken over under us (the disk stalled past the staleness): the other download and ours write the
    // same bytes, and the hash check catches any mix. Not a crash of the server.
    onCompromised: () => {},
  });
  try {
    if (!existsSync(blob)) await fetchBlob(blob, file, opts);
    cache.link(commit, file.path, file.etag);
  } finally {
    await release();
  }
}

/** Downloads into `<blob>.incomplete` (resuming what is there), checks it, renames it into place. */
async function fetchBlob(blob: string, file: RepoFile, opts: DownloadOptions): Promise<void> {
  const partial = `${blob}.incomplete`;
  checkRoom(partial, file.size);
  for (let attempt = 0; ; attempt++) {
    await transfer(partial, file, opts);
    const problem = await check(partial, file);
    if (problem === null) break;
    rmSync(partial, { force: true });
    if (attempt === 1) throw new CorruptDownloadError(`${file.path}: ${problem} twice; the download was deleted`);
  }
  renameSync(partial, blob);
}

/** Appends to `partial` until it holds `file.size` bytes, reopening from where it stopped when a transfer breaks. */
async function transfer(partial: string, file: RepoFile, opts: DownloadOptions): Promise<void> {
  const retries = opts.retries ?? 5;
  const backoff = opts.backoff ?? ((n: number) => new Promise<void>((r) => setTimeout(r, 1000 * n)));
  let failures = 0;
  opts.onStart?.(existsSync(partial) ? Math.min(statSync(partial).size, file.size) : 0);
  for (;;) {
    let have = existsSync(partial) ? statSync(partial).size : 0;
    if (have > file.size) {
      rmSync(partial); // not this file's bytes
      have = 0;
    }
    if (have === file.size) return;
    const before = have;
    const counted = new Transform({
      transform(chunk: Buffer, _enc, done) {
        have += chunk.length;
        opts.onProgress?.(have);
        done(null, chunk);
      },
    });
    // Opening is retried by `open` itself: what is retried here is a transfer that breaks.
    const { body, from } = await opts.open(have);
    if (from !== have) {
      truncateSync(partial, from);
      have = from;
    }
    const out = createWriteStream(partial, { flags: 'a' });
    try {
      await pipeline(Readable.fromWeb(body), counted, out);
      if (have !== file.size) throw new Error(`the transfer ended at ${have} of ${file.size} bytes`);
      return;
    } catch (err) {
      // A write still in flight when the transfer broke lands after it: the next append must start after it.
      if (!out.closed) await new Promise<void>((closed) => out.once('close', () => closed()));
      if ((err as NodeJS.ErrnoException).code === 'ENOSPC') {
        rmSync(partial, { force: true });
        throw new Error(`${file.path}: the disk is full (${partial}); ${file.size} bytes were needed`);
      }
      failures = have > before ? 1 : failures + 1;
      if (failures > retries) throw err;
      await backoff(failures);
    }
  }
}

/** Why `partial` is not `file` (its size or its hash), or null. */
async function check(partial: string, file: RepoFile): Promise<string | null> {
  const size = statSync(partial).size;
  if (size !== file.size) return `${size} bytes received, ${file.size} announced`;
  const hash = createHash(file.lfs ? 'sha256' : 'sha1');
  if (!file.lfs) hash.update(`blob ${size}\0`);
  for await (const chunk of createReadStream(partial)) hash.update(chunk as Buffer);
  const got = hash.digest('hex');
  return got === file.etag ? null : `its ${file.lfs ? 'sha256' : 'git blob id'} is ${got}, the Hub announced ${file.etag}`;
}

/** Refuses a download the disk cannot hold, before it starts. */
function checkRoom(partial: string, size: number): void {
  const have = existsSync(partial) ? statSync(partial).size : 0;
  const { bavail, bsize } = statfsSync(join(partial, '..'));
  const free = bavail * bsize;
  if (size - have > free) throw new Error(`not enough disk space for ${partial}: ${size - have} bytes needed, ${free} free`);
}
