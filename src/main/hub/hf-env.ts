/**
 * The Hugging Face conventions every Hub client honours, as huggingface_hub
 * defines them (constants.py): where the Hub is, who we are, where the cache
 * is, and whether the network may be used at all.
 */
import { readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';

export interface HfEnv {
  /** HF_ENDPOINT: the Hub's base URL (a mirror, a private Hub); no trailing slash. */
  endpoint: string;
  /** HF_TOKEN, else the token file (HF_TOKEN_PATH, default $HF_HOME/token); sent to the endpoint only. */
  token: string | undefined;
  /** Where the token came from, for messages: never the token itself. */
  tokenSource: string;
  /** HF_HUB_CACHE, default $HF_HOME/hub (HF_HOME: default $XDG_CACHE_HOME/huggingface, or ~/.cache/huggingface). */
  cacheDir: string;
  /** HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE): serve from the cache only, never a request. */
  offline: boolean;
}

export const DEFAULT_ENDPOINT = 'https://huggingface.co';
const TRUE = new Set(['1', 'on', 'yes', 'true']);

export function hfEnv(env: NodeJS.ProcessEnv = process.env): HfEnv {
  const home = env['HF_HOME'] || join(env['XDG_CACHE_HOME'] || join(homedir(), '.cache'), 'huggingface');
  const tokenPath = env['HF_TOKEN_PATH'] || join(home, 'token');
  const fromEnv = env['HF_TOKEN'] || env['HUGGING_FACE_HUB_TOKEN'];
  const fromFile = fromEnv ? undefined : readToken(tokenPath);
  return {
    endpoint: (env['HF_ENDPOINT'] || DEFAULT_ENDPOINT).replace(/\/+$/, ''),
    token: fromEnv || fromFile,
    tokenSource: fromEnv ? (env['HF_TOKEN'] ? 'HF_TOKEN' : 'HUGGING_FACE_HUB_TOKEN') : fromFile ? tokenPath : 'none',
    cacheDir: env['HF_HUB_CACHE'] || env['HUGGINGFACE_HUB_CACHE'] || join(home, 'hub'),
    offline: TRUE.has((env['HF_HUB_OFFLINE'] || env['TRANSFORMERS_OFFLINE'] || '').trim().toLowerCase()),
  };
}

function readToken(path: string): string | undefined {
  try {
    return readFileSync(path, 'utf8').trim() || undefined;
  } catch {
    return undefined;
  }
}
