/**
 * A model named by its Hugging Face Hub id: `ORG/NAME[@REVISION]`. The
 * repository id follows huggingface_hub's validate_repo_id (letters, digits,
 * `-`, `_`, `.`; no `--` or `..`; at most 96 characters); REVISION is a
 * branch, a tag or a commit, and may hold slashes (`refs/pr/1`).
 */
import { existsSync } from 'node:fs';

export interface HubModelId {
  /** "ORG/NAME". */
  repo: string;
  /** A branch, tag or commit; `main` when none was given. */
  revision: string;
}

const SEGMENT = /^[\w.-]+$/;
export const COMMIT = /^[0-9a-f]{40}$/;

/** `value` as a Hub id, or null when it is not one (a models-dir name, a path). */
export function parseHubId(value: string): HubModelId | null {
  const at = value.indexOf('@');
  const repo = at < 0 ? value : value.slice(0, at);
  const revision = at < 0 ? 'main' : value.slice(at + 1);
  const parts = repo.split('/');
  if (parts.length !== 2 || !parts.every((p) => SEGMENT.test(p) && !/^[.-]|[.-]$/.test(p))) return null;
  if (repo.length > 96 || repo.includes('--') || repo.includes('..') || repo.endsWith('.git')) return null;
  if (revision === '' || revision.split('/').some((p) => p === '' || p === '.' || p === '..')) return null;
  return { repo, revision };
}

/** `given` as a Hub id where it is one and, when it may name a folder (`paths`), no folder of that path is there. */
export function hubIdOf(given: string, paths: boolean): HubModelId | null {
  return paths && existsSync(given) ? null : parseHubId(given);
}

/** The name a Hub model answers to in URLs and metrics labels: its repository's NAME. */
export function shortNameOf(repo: string): string {
  return repo.slice(repo.indexOf('/') + 1);
}

export const hubIdText = (id: HubModelId): string => (id.revision === 'main' ? id.repo : `${id.repo}@${id.revision}`);
