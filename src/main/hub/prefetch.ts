/**
 * `slabserve download`: models fetched ahead of serving, for an image build
 * or a machine that will serve offline. Into the Hugging Face cache (where
 * `serve --model ORG/NAME` and HF_HUB_OFFLINE=1 find them), or with a models
 * directory as plain folders (DIR/NAME, real files: `serve --models-dir DIR`
 * serves them by name), fetched through a cache inside DIR that is emptied
 * into the folders, so nothing is stored twice.
 */
import { copyFileSync, mkdirSync, realpathSync, renameSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { ValidationError } from '../../shared/errors.js';
import type { ModelOverrides } from '../../shared/model-format/model-config.js';
import { fetchModel } from './fetch-model.js';
import { hfEnv, type HfEnv } from './hf-env.js';
import { hubIdText, parseHubId, shortNameOf } from './hub-id.js';
import { downloadProgress } from './progress.js';

export interface PrefetchOptions {
  overrides: ModelOverrides;
  /** Plain folders here instead of the cache. */
  modelsDir?: string | undefined;
  log: (line: string) => void;
  hf?: HfEnv;
}

/** Fetches each id; returns where each one is (a snapshot of the cache, or DIR/NAME). */
export async function prefetchModels(ids: readonly string[], opts: PrefetchOptions): Promise<string[]> {
  const parsed = ids.map((given) => parseHubId(given) ?? badId(given));
  const env = opts.hf ?? hfEnv();
  const staging = opts.modelsDir ? join(opts.modelsDir, '.slabserve-download') : undefined;
  const out: string[] = [];
  for (const id of parsed) {
    const text = hubIdText(id);
    const fetched = await fetchModel(id, { env: staging ? { ...env, cacheDir: staging } : env, overrides: opts.overrides, log: opts.log, progress: downloadProgress(text, opts.log) });
    let dir = fetched.dir;
    if (opts.modelsDir) {
      dir = join(opts.modelsDir, shortNameOf(id.repo));
      intoPlainFolder(fetched.dir, fetched.files, dir);
    }
    opts.log(`slabserve: ${text}: commit ${fetched.commit} in ${dir}`);
    out.push(dir);
  }
  if (staging) rmSync(staging, { recursive: true, force: true });
  return out;
}

/** Moves each file of a snapshot (a link to its blob) into `target` as a real file; a blob two paths share is copied. */
function intoPlainFolder(snapshot: string, files: readonly string[], target: string): void {
  rmSync(target, { recursive: true, force: true });
  const blobs = files.map((file) => realpathSync(join(snapshot, file)));
  for (const [i, file] of files.entries()) {
    const blob = blobs[i]!;
    const dest = join(target, file);
    mkdirSync(dirname(dest), { recursive: true });
    if (blobs.indexOf(blob) !== blobs.lastIndexOf(blob)) copyFileSync(blob, dest);
    else renameSync(blob, dest);
  }
}

function badId(given: string): never {
  throw new ValidationError(`"${given}" is no Hub id: ORG/NAME, or ORG/NAME@REVISION (a branch, tag or commit)`);
}
