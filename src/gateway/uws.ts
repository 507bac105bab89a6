/**
 * The one module that loads uWebSockets.js.
 *
 * uWS is not on npm under its own name, and no one build there covers every
 * Node.js and C library: @btc-vision's 20.57 has binaries for Node.js 20-25
 * built against glibc 2.38, @trufflesuite's 20.30 for Node.js 16-20 against
 * glibc 2.27. Both are dependencies; the first in UWS_BUILDS whose binary
 * loads here serves (chooseUws). The binary is required directly: the
 * trufflesuite package's own entry silently falls back to a slow pure-JS
 * server, and a serving system refuses to start instead, saying what would
 * work (refusal).
 *
 * The gateway uses the API the two share. Where 20.57 differs (getParameter
 * and getQuery(key) may return undefined, closeOnBackpressureLimit is a
 * boolean), the types here are 20.57's and the callers handle both.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import type * as UWS from '@btc-vision/uwebsockets.js';

export type { HttpRequest, HttpResponse, TemplatedApp, us_listen_socket, us_socket_context_t, WebSocket } from '@btc-vision/uwebsockets.js';

/** The builds slabserve can serve with, the newer first: the folder of its binaries in the package. */
export const UWS_BUILDS: readonly { package: string; folder: string }[] = [
  { package: '@btc-vision/uwebsockets.js', folder: '.' },
  { package: '@trufflesuite/uws-js-unofficial', folder: 'binaries' },
];

/** The Node.js line of each module ABI a build ships (process.versions.modules). */
const NODE_OF_ABI: Readonly<Record<number, number>> = { 83: 14, 93: 16, 108: 18, 115: 20, 127: 22, 137: 24, 141: 25 };
/** The oldest Node.js line slabserve runs on (package.json's engines): a refusal names no older one. */
const OLDEST_NODE = 20;

/** The build that serves: what /info and the start-up log name, and what each gateway thread loads. */
export interface UwsChoice {
  package: string;
  version: string;
  /** Its native binary for this platform and Node.js. */
  binary: string;
}

/** A build as installed, seen from here: its binary for this Node.js, and the Node.js ABIs it has binaries for on this platform. */
export interface UwsCandidate extends UwsChoice {
  abis: number[];
}

/** Where this process runs: what a binary must match. */
export interface Runtime {
  node: string;
  abi: number;
  platform: string;
  arch: string;
  /** glibc's version ("2.36"); null on another C library (musl) or where Node.js cannot tell. */
  glibc: string | null;
}

export function thisRuntime(): Runtime {
  const header = (process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined)?.header;
  return { node: process.version, abi: Number(process.versions.modules), platform: process.platform, arch: process.arch, glibc: header?.glibcVersionRuntime ?? null };
}

/** Each build of UWS_BUILDS that is installed, with its binary for `runtime`. */
export function uwsCandidates(runtime: Runtime = thisRuntime()): UwsCandidate[] {
  const prefix = `uws_${runtime.platform}_${runtime.arch}_`;
  return UWS_BUILDS.flatMap((build) => {
    const root = packageFolder(build.package);
    if (root === null) return []; // not installed (an optional install that failed)
    const folder = join(root, build.folder);
    const version = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string }).version;
    const abis = readdirSync(folder)
      .filter((f) => f.startsWith(prefix) && f.endsWith('.node'))
      .map((f) => Number(f.slice(prefix.length, -'.node'.length)))
      .filter((abi) => (NODE_OF_ABI[abi] ?? Infinity) >= OLDEST_NODE)
      .sort((a, b) => a - b);
    return [{ package: build.package, version, binary: join(folder, `${prefix}${runtime.abi}.node`), abis }];
  });
}

/** Where package `name` is installed, as Node's resolution finds it (its exports may hide package.json); null: nowhere. */
function packageFolder(name: string): string | null {
  const paths = createRequire(import.meta.url).resolve.paths(name) ?? [];
  const found = paths.map((dir) => join(dir, name)).find((dir) => existsSync(join(dir, 'package.json')));
  return found ?? null;
}

/**
 * The first candidate whose binary loaded (`errors[i]` null), or the refusal: what was tried, why each
 * failed, and what would work. `glibcOf(c)` is the newest glibc a candidate's binaries need.
 */
export function chooseUws(candidates: readonly UwsCandidate[], errors: readonly (string | null)[], runtime: Runtime, glibcOf: (c: UwsCandidate) => string | null): { choice: UwsChoice } | { refusal: string } {
  const i = errors.findIndex((e) => e === null);
  if (i >= 0) {
    const { package: pkg, version, binary } = candidates[i]!;
    return { choice: { package: pkg, version, binary } };
  }
  return { refusal: refusal(candidates, errors, runtime, glibcOf) };
}

const newerOrSame = (have: string, need: string) => {
  const [a, b] = [have, need].map((v) => v.split('.').map(Number));
  return a![0]! !== b![0]! ? a![0]! > b![0]! : (a![1] ?? 0) >= (b![1] ?? 0);
};
const nodeLines = (abis: number[]) => abis.map((abi) => NODE_OF_ABI[abi] ?? `ABI ${abi}`).join(', ');

function refusal(candidates: readonly UwsCandidate[], errors: readonly (string | null)[], r: Runtime, glibcOf: (c: UwsCandidate) => string | null): string {
  const libc = r.glibc ? `glibc ${r.glibc}` : 'a C library other than glibc';
  const lines = [
    `uWebSockets.js has no native binary that loads here (Node.js ${r.node}, ABI ${r.abi}, on ${r.platform}-${r.arch} with ${libc}), and slabserve does not run on its slow JS fallback.`,
  ];
  const fits: string[] = [];
  const elsewhere: string[] = [];
  candidates.forEach((c, k) => {
    const need = glibcOf(c);
    const builtFor = c.abis.length ? `Node.js ${nodeLines(c.abis)}${need ? ` with glibc >= ${need}` : ''}` : `nothing on ${r.platform}-${r.arch}`;
    lines.push(`  ${c.package} ${c.version} has binaries for ${builtFor}; here: ${errors[k] ?? 'not tried'}`);
    if (!c.abis.length) return;
    if (r.glibc && (!need || newerOrSame(r.glibc, need))) fits.push(`Node.js ${nodeLines(c.abis)}`);
    else if (need) elsewhere.push(`Node.js ${nodeLines(c.abis)} on a system with glibc >= ${need} (Debian 13, Ubuntu 24.04)`);
  });
  if (!candidates.length) lines.push(`  none of ${UWS_BUILDS.map((b) => b.package).join(', ')} is installed: run npm ci`);
  const ways = [...(fits.length ? [`on this ${libc}: ${fits.join(' or ')}`] : []), ...elsewhere, "or slabserve's Docker image (Node.js 24 on Ubuntu 24.04)"];
  lines.push(`What works: ${ways.join('; ')}.`);
  return lines.join('\n');
}

/** The newest glibc symbol version a binary references ("2.38"), read from its bytes; null where it names none. */
export function glibcNeeded(binary: string): string | null {
  let text: string;
  try {
    text = readFileSync(binary).toString('latin1');
  } catch {
    return null;
  }
  let best: string | null = null;
  for (const m of text.matchAll(/GLIBC_(\d+\.\d+)/g)) if (best === null || !newerOrSame(best, m[1]!)) best = m[1]!;
  return best;
}

/** The newest glibc a candidate's binaries on this platform need (read from one of them). */
export function candidateGlibc(c: UwsCandidate): string | null {
  const abi = c.abis[c.abis.length - 1];
  return abi === undefined ? null : glibcNeeded(c.binary.replace(/_\d+\.node$/, `_${abi}.node`));
}

/** Why `binary` does not load here (the first line of the loader's error), or null: it loaded. */
export function tryLoad(binary: string): string | null {
  try {
    createRequire(import.meta.url)(binary);
    return null;
  } catch (err) {
    return (err as Error).message.split('\n')[0]!;
  }
}

/** The build that serves here, chosen in this thread (the candidates tried in order, none after the first that loads); throws the refusal. */
export function chooseUwsHere(): UwsChoice {
  const runtime = thisRuntime();
  const candidates = uwsCandidates(runtime);
  const errors: (string | null)[] = [];
  for (const c of candidates) {
    const error = tryLoad(c.binary);
    errors.push(error);
    if (error === null) break; // two uWS builds must not both load in one thread
  }
  const chosen = chooseUws(candidates, errors, runtime, candidateGlibc);
  if ('refusal' in chosen) throw new Error(chosen.refusal);
  return chosen.choice;
}

/** uWS's module: `choice`'s binary (what the main thread's start-up check chose), or the one chosen here. */
export function loadUws(choice: UwsChoice = chooseUwsHere()): typeof UWS {
  return createRequire(import.meta.url)(choice.binary) as typeof UWS;
}
