#!/usr/bin/env node
// Copies the production dependency closure of a package root's node_modules into
// another folder, pruned to linux-x64 binaries. Used by prepare.sh.
//
//   node bench/gpu/stage-deps.mjs --root /work/main --out STAGE/node_modules [--extra hdr-histogram-js,cli-progress]
//
// The closure: package.json `dependencies` and `optionalDependencies` (an optional one
// that is not installed is skipped), `--extra` names (packages the bench needs that are
// devDependencies: prepare.sh's BENCH_DEPS), and, recursively, each package's `dependencies`,
// `optionalDependencies` and installed `peerDependencies`, resolved as Node resolves them
// (the requester's own node_modules first, then each parent's). Each package folder is
// copied without its nested node_modules; the nested packages the walk needs are copied
// to the same relative place.
//
// Pruning (the bundle runs on linux-x64, on the node that runs this script: prepare.sh
// carries that one, so its ABI is the one kept):
//   onnxruntime-node/bin/napi-v6/*          all but linux/x64, and any CUDA provider placed there
//   uWebSockets.js's two builds' *.node     all but uws_linux_x64_<abi>.node; dist/*.node
//   prebuilds/*                             all but linux-x64*
//   @types/*, undici-types                  type declarations only
// Prints one JSON line: packages copied, bytes, what was pruned.
import { cpSync, existsSync, readFileSync, readdirSync, rmSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve, sep } from 'node:path';
import { parseArgs } from 'node:util';

const { values } = parseArgs({
  options: {
    root: { type: 'string' },
    out: { type: 'string' },
    extra: { type: 'string', default: '' },
  },
});
if (!values.root || !values.out) {
  console.error('usage: stage-deps.mjs --root DIR --out DIR [--extra a,b]');
  process.exit(2);
}
const root = resolve(values.root);
const out = resolve(values.out);
const readJson = (f) => JSON.parse(readFileSync(f, 'utf8'));

/** Folder of package `name` as seen from folder `from` (a package folder or the root), or null. */
function resolvePkg(name, from) {
  let dir = from;
  for (;;) {
    const candidate = join(dir, 'node_modules', name);
    if (existsSync(join(candidate, 'package.json'))) return candidate;
    if (dir === root) return null;
    // climb: .../node_modules/@scope/pkg -> .../node_modules -> its owner
    let parent = dirname(dir);
    while (parent !== root && !existsSync(join(parent, 'package.json'))) parent = dirname(parent);
    if (parent === dir) return null;
    dir = parent;
  }
}

const rootPkg = readJson(join(root, 'package.json'));
const seen = new Map(); // folder -> name
const missing = [];
const queue = [];
const want = (name, from, optional) => queue.push({ name, from, optional });
for (const n of Object.keys(rootPkg.dependencies ?? {})) want(n, root, false);
for (const n of Object.keys(rootPkg.optionalDependencies ?? {})) want(n, root, true);
for (const n of values.extra.split(',').map((s) => s.trim()).filter(Boolean)) want(n, root, false);

while (queue.length) {
  const { name, from, optional } = queue.shift();
  const dir = resolvePkg(name, from);
  if (!dir) {
    if (!optional) missing.push(`${name} (needed from ${relative(root, from) || '.'})`);
    continue;
  }
  if (seen.has(dir)) continue;
  seen.set(dir, name);
  const pkg = readJson(join(dir, 'package.json'));
  for (const n of Object.keys(pkg.dependencies ?? {})) want(n, dir, false);
  for (const n of Object.keys(pkg.optionalDependencies ?? {})) want(n, dir, true);
  for (const n of Object.keys(pkg.peerDependencies ?? {})) want(n, dir, true);
}
if (missing.length) {
  console.error(`stage-deps: not installed: ${missing.join(', ')} (run npm ci first)`);
  process.exit(1);
}

rmSync(out, { recursive: true, force: true });
for (const dir of seen.keys()) {
  const rel = relative(join(root, 'node_modules'), dir);
  cpSync(dir, join(out, rel), {
    recursive: true,
    dereference: true,
    // skip nested node_modules (copied on their own when needed)
    filter: (src) => !(src !== dir && src.slice(dir.length).split(sep).includes('node_modules')),
  });
}

const pruned = [];
const prune = (p) => {
  if (existsSync(p)) {
    pruned.push(relative(out, p));
    rmSync(p, { recursive: true, force: true });
  }
};
const ortBin = join(out, 'onnxruntime-node', 'bin', 'napi-v6');
if (existsSync(ortBin)) {
  for (const platform of readdirSync(ortBin)) {
    const pdir = join(ortBin, platform);
    if (platform !== 'linux') prune(pdir);
    else for (const arch of readdirSync(pdir)) if (arch !== 'x64') prune(join(pdir, arch));
  }
  // a CUDA provider placed by `npm run cuda:install` travels as its own item (prepare.sh)
  const x64 = join(ortBin, 'linux', 'x64');
  if (existsSync(x64)) for (const f of readdirSync(x64)) if (f.startsWith('libonnxruntime_providers_')) prune(join(x64, f));
}
// uWebSockets.js: both builds the server chooses from (src/gateway/uws.ts), each with its binary folder
const keep = `uws_linux_x64_${process.versions.modules}.node`;
let kept = 0;
for (const [pkg, folder] of [['@btc-vision/uwebsockets.js', '.'], ['@trufflesuite/uws-js-unofficial', 'binaries']]) {
  const dir = join(out, pkg, folder);
  if (!existsSync(dir)) continue;
  for (const f of readdirSync(dir)) if (f.endsWith('.node') && f !== keep) prune(join(dir, f));
  if (existsSync(join(dir, keep))) kept++;
  const dist = join(out, pkg, 'dist');
  if (existsSync(dist)) for (const f of readdirSync(dist)) if (f.endsWith('.node')) prune(join(dist, f));
}
if (kept === 0) {
  console.error(`stage-deps: no uWebSockets.js build has ${keep}`);
  process.exit(1);
}
// prebuilds/<platform-arch>/ folders (node-gyp-build layout)
const walk = (d) => {
  for (const e of readdirSync(d, { withFileTypes: true })) {
    if (!e.isDirectory()) continue;
    const p = join(d, e.name);
    if (e.name === 'prebuilds') {
      for (const t of readdirSync(p)) if (!t.startsWith('linux-x64')) prune(join(p, t));
    } else walk(p);
  }
};
walk(out);
prune(join(out, '@types'));
prune(join(out, 'undici-types'));

let bytes = 0;
let files = 0;
const size = (d) => {
  for (const e of readdirSync(d, { withFileTypes: true })) {
    const p = join(d, e.name);
    if (e.isDirectory()) size(p);
    else {
      bytes += statSync(p).size;
      files++;
    }
  }
};
size(out);
console.log(JSON.stringify({ packages: seen.size, files, bytes, pruned: pruned.length, prunedPaths: pruned }));
