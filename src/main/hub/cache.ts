/**
 * One repository's folder in the Hugging Face cache, laid out as
 * huggingface_hub lays it out, so a model fetched by `hf download` or by
 * text-embeddings-inference is used as it is, and ours is theirs:
 *
 *   $HF_HUB_CACHE/models--ORG--NAME/
 *     blobs/<etag>                 each file's bytes once (etag: the LFS sha256, else the git blob id)
 *     snapshots/<commit>/<path>    a relative symlink to its blob, per commit
 *     refs/<revision>              the commit a branch or tag named when it was fetched
 *   $HF_HUB_CACHE/.locks/models--ORG--NAME/   the download locks
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';

export class RepoCache {
  /** models--ORG--NAME under the cache. */
  readonly folder: string;
  readonly locks: string;

  constructor(cacheDir: string, repo: string) {
    const name = `models--${repo.replaceAll('/', '--')}`;
    this.folder = join(cacheDir, name);
    this.locks = join(cacheDir, '.locks', name);
  }

  blobPath(etag: string): string {
    return join(this.folder, 'blobs', etag);
  }

  snapshotDir(commit: string): string {
    return join(this.folder, 'snapshots', commit);
  }

  /** The commit `revision` named when it was last fetched, if the cache knows it. */
  readRef(revision: string): string | undefined {
    try {
      return readFileSync(join(this.folder, 'refs', revision), 'utf8').trim() || undefined;
    } catch {
      return undefined;
    }
  }

  writeRef(revision: string, commit: string): void {
    if (revision === commit) return;
    const path = join(this.folder, 'refs', revision);
    mkdirSync(dirname(path), { recursive: true });
    if (this.readRef(revision) !== commit) writeFileSync(path, commit);
  }

  /** Whether snapshot `commit` has `file` (its link resolves to a blob). */
  has(commit: string, file: string): boolean {
    return existsSync(join(this.snapshotDir(commit), file));
  }

  /** Points snapshot `commit`'s `file` at blob `etag`, by a relative link as huggingface_hub makes it. */
  link(commit: string, file: string, etag: string): void {
    const pointer = join(this.snapshotDir(commit), file);
    mkdirSync(dirname(pointer), { recursive: true });
    rmSync(pointer, { force: true }); // a dangling link left by a blob removed by hand
    symlinkSync(relative(dirname(pointer), this.blobPath(etag)), pointer);
  }

  /** Every file of snapshot `commit`, relative to it ('/'-separated). */
  snapshotFiles(commit: string): string[] {
    const root = this.snapshotDir(commit);
    if (!existsSync(root)) return [];
    return readdirSync(root, { recursive: true, withFileTypes: true })
      .filter((d) => !d.isDirectory() && existsSync(join(d.parentPath, d.name)))
      .map((d) => relative(root, join(d.parentPath, d.name)).split('\\').join('/'));
  }
}
