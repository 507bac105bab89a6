/** Where the suite finds the repository's pieces, from dist/bench/suite/*.js. */
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
/** `slabserve serve` as users start it. */
export const CLI = join(REPO_ROOT, 'dist', 'src', 'cli.js');
/** The transformers.js peer (bench/peer-transformers.ts). */
export const PEER = join(REPO_ROOT, 'dist', 'bench', 'peer-transformers.js');
