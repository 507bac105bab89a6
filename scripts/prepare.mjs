#!/usr/bin/env node
/**
 * What `npm start` and `npm test` need before they run, in one process (each
 * nested `npm run` printed npm's config warnings again and cost a second):
 *
 *   1. dist/ built from the sources: tsc only when a source changed since the
 *      last build (a restart took 13 s of tsc; now it takes none);
 *   2. the default models generated, the missing ones only.
 *
 * "Changed" is the list of sources with their sizes and modification times,
 * against the one the last successful build recorded in dist/.sources; a file
 * added, removed, touched or a new package-lock.json rebuilds. `npm run build`
 * (--force --no-models) runs tsc whatever changed, and records the list too.
 */
import { execFileSync } from 'node:child_process';
import { chmodSync, existsSync, readdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const STAMP = join(ROOT, 'dist', '.sources');
/** What tsconfig.json compiles (its "include"), and what else changes the output. */
const SOURCE_DIRS = ['src', 'bench', 'models'];
const OTHER_INPUTS = ['tsconfig.json', 'package-lock.json'];

/** Every .ts source under `dir` (models/: its top-level files only, as tsconfig includes models/*.ts). */
function sources(dir, recurse) {
  const out = [];
  for (const e of readdirSync(join(ROOT, dir), { withFileTypes: true })) {
    const path = join(dir, e.name);
    if (e.isDirectory()) {
      if (recurse) out.push(...sources(path, true));
    } else if (e.name.endsWith('.ts')) out.push(path);
  }
  return out;
}

/** One line per input: its path, size and modification time. */
export function sourceList() {
  const files = [...SOURCE_DIRS.flatMap((d) => sources(d, d !== 'models')), ...OTHER_INPUTS.filter((f) => existsSync(join(ROOT, f)))];
  return files
    .sort()
    .map((f) => {
      const s = statSync(join(ROOT, f));
      return `${relative(ROOT, join(ROOT, f))} ${s.size} ${Math.floor(s.mtimeMs)}`;
    })
    .join('\n');
}

const runTsc = () => {
  execFileSync(process.execPath, [join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(ROOT, 'tsconfig.json')], { stdio: 'inherit' });
  // tsc writes 0644; `npx slabserve` runs package.json's bin directly, so it must be executable
  // (npm marks it only when it links bins at install, before dist/ exists on a fresh clone).
  chmodSync(join(ROOT, 'dist', 'src', 'cli.js'), 0o755);
};

/**
 * Builds dist/ when a source changed (or always, with `force`); whether it did.
 * `stamp` (where the last build's source list is kept) and `tsc` are there for tests.
 */
export function build({ force = false, log = (line) => process.stderr.write(line + '\n'), stamp = STAMP, tsc = runTsc } = {}) {
  const list = sourceList();
  const last = existsSync(stamp) ? readFileSync(stamp, 'utf8') : null;
  if (last === list && !force) {
    log('slabserve: dist/ is up to date with the sources (npm run build rebuilds it anyway)');
    return false;
  }
  if (!force) log(last === null ? 'slabserve: building dist/ (tsc, about 15 s)' : 'slabserve: sources changed since the last build: building dist/ (tsc, about 15 s)');
  tsc();
  writeFileSync(stamp, list);
  return true;
}

/** Generates the default models that are missing (about a second for all three). */
export function models() {
  execFileSync(process.execPath, [join(ROOT, 'dist', 'models', 'generate.js'), '--missing'], { stdio: 'inherit' });
}

// node scripts/prepare.mjs [--force] [--no-models]: --force runs tsc whatever changed (npm run build).
if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const args = process.argv.slice(2);
  build({ force: args.includes('--force') });
  if (!args.includes('--no-models')) models();
}
