/**
 * @huggingface/tokenizers (pure JS) against tokenizers (Rust, N-API), on the
 * bert-base-uncased tokenizer.json from buildBertTokenizerJson().
 *
 *   npx tsc -p tsconfig.json && node dist/bench/tokenizers.js [--quick]
 *
 * Each library is called through its own API the way the gateway would call it:
 *   - JS:   tokenizer.encode(text, { return_token_type_ids: true })   synchronous, on the event loop
 *   - Rust: await tokenizer.encode(text) / await tokenizer.encodeBatch(texts)
 *           async only: the work runs on the libuv thread pool, the event loop pays
 *           for the hop, the promise and reading the ids back (getIds/getTypeIds).
 * Both produce Int32Array ids + type ids, what the gateway hands to the batcher.
 *
 * Reported per scenario (median over alternating rounds):
 *   wall µs/text     elapsed / texts
 *   texts/s          texts / elapsed
 *   loop µs/text     event-loop active time per text (performance.eventLoopUtilization):
 *                    how long the main thread is unavailable for other requests
 *   cpu µs/text      process CPU (all threads) per text
 * Plus: identical-ids check on random texts, install size, cold load time.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir, cpus, platform, arch } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { Tokenizer as JsTokenizer } from '@huggingface/tokenizers';
import { Tokenizer as RsTokenizer } from 'tokenizers';
import { createTokenizer } from '../src/core/tokenizer.js';
import { mulberry32 as rng } from '../src/modelgen/rng.js';
import { bertUncasedVocab, buildBertTokenizerJson } from '../src/modelgen/tokenizer-json.js';

const require = createRequire(import.meta.url);
const here = dirname(fileURLToPath(import.meta.url));
// dist/bench/tokenizers.js -> repo root is two levels up
const repoRoot = resolve(here, '..', '..');
const QUICK = process.argv.includes('--quick');

// ---------------------------------------------------------------- texts


const vocab = bertUncasedVocab();
const WORDS = vocab.filter((t) => /^[a-z]{2,}$/.test(t));
const PIECES = vocab.filter((t) => /^##[a-z]{2,}$/.test(t)).map((t) => t.slice(2));
const PUNCT = [',', '.', ';', ':', '!', '?', "'s", ' -', ' (', ')', '"'];

function pick<T>(r: () => number, xs: readonly T[]): T {
  return xs[Math.floor(r() * xs.length)]!;
}

/** English-looking text from real vocabulary words; some words get a continuation piece glued on. */
function makeText(r: () => number, words: number): string {
  const out: string[] = [];
  let capital = true;
  for (let i = 0; i < words; i++) {
    let w = pick(r, WORDS);
    if (r() < 0.15) w += pick(r, PIECES); // forces a WordPiece split
    if (r() < 0.05) w = String(Math.floor(r() * 10000));
    if (capital || r() < 0.05) w = w[0]!.toUpperCase() + w.slice(1);
    capital = false;
    out.push(w);
    if (r() < 0.12) {
      const p = pick(r, PUNCT);
      out[out.length - 1] += p;
      if (p === '.' || p === '!' || p === '?') capital = true;
    }
  }
  return out.join(' ') + '.';
}

/** Texts built to stress normalisation: accents, case, CJK, control chars, long words, emoji. */
function makeNastyText(r: () => number): string {
  const parts: string[] = [];
  const n = 1 + Math.floor(r() * 30);
  for (let i = 0; i < n; i++) {
    const k = r();
    if (k < 0.35) parts.push(pick(r, WORDS));
    else if (k < 0.45) parts.push(pick(r, WORDS).toUpperCase());
    else if (k < 0.52) parts.push(pick(r, ['café', 'naïve', 'Ångström', 'résumé', 'Müller', 'façade', 'jalapeño', 'São', 'Łódź', 'e\u0301te\u0301']));
    else if (k < 0.58) {
      let s = '';
      const m = 1 + Math.floor(r() * 6);
      for (let j = 0; j < m; j++) s += String.fromCodePoint(0x4e00 + Math.floor(r() * 0x5200));
      parts.push(s);
    } else if (k < 0.63) parts.push(pick(r, ['日本語', 'ひらがな', 'カタカナ', '한국어', 'Привет', 'مرحبا', 'שלום', 'ελληνικά', 'ไทย']));
    else if (k < 0.70) parts.push(pick(r, ['!', '?!', '...', '--', '"quoted"', "it's", '(x)', '[y]', '{z}', '@user', '#tag', '$5.00', '50%', 'a/b', 'x_y', '~', '`', '^', '|', '\\']));
    else if (k < 0.74) parts.push(pick(r, WORDS).repeat(20 + Math.floor(r() * 20))); // > 100 chars
    else if (k < 0.77) parts.push(pick(r, ['\t', '\n', '\r\n', '\u00a0', '\u200b', '\u0000', '\ufffd', '\u0007', '\u3000', '\u2028']));
    else if (k < 0.80) parts.push(pick(r, ['😀', '👍🏽', '🇫🇷', '❤️', '∑', '€', '©', '½', 'ﬁ', '①']));
    else if (k < 0.83) parts.push(String(Math.floor(r() * 1e9)));
    else if (k < 0.86) parts.push(pick(r, WORDS) + pick(r, PIECES) + pick(r, PIECES));
    else if (k < 0.88) parts.push('[CLS]', '[SEP]', '[MASK]', '[UNK]', '[PAD]'); // specials written in the text
    else parts.push(pick(r, WORDS) + pick(r, ['.', ',', '!', ';']));
  }
  const sep = () => pick(r, [' ', ' ', ' ', '', '  ']);
  return parts.map((p) => p + sep()).join('');
}

// ---------------------------------------------------------------- adapters

interface Ids {
  ids: Int32Array;
  typeIds: Int32Array;
}

const tokenizerJson = buildBertTokenizerJson();
const tokenizerJsonString = JSON.stringify(tokenizerJson);

const js = new JsTokenizer(tokenizerJson, {});
const rs = RsTokenizer.fromString(tokenizerJsonString);

function jsEncode(text: string, pair?: string): Ids {
  const e = js.encode(text, { text_pair: pair ?? null, return_token_type_ids: true });
  return { ids: Int32Array.from(e.ids), typeIds: Int32Array.from(e.token_type_ids) };
}

async function rsEncode(text: string, pair?: string): Promise<Ids> {
  const e = await rs.encode(text, pair ?? null);
  return { ids: Int32Array.from(e.getIds()), typeIds: Int32Array.from(e.getTypeIds()) };
}

async function rsEncodeBatch(texts: string[]): Promise<Ids[]> {
  const es = await rs.encodeBatch(texts);
  return es.map((e) => ({ ids: Int32Array.from(e.getIds()), typeIds: Int32Array.from(e.getTypeIds()) }));
}

// ---------------------------------------------------------------- identity check

function sameIds(a: Ids, b: Ids): boolean {
  if (a.ids.length !== b.ids.length) return false;
  for (let i = 0; i < a.ids.length; i++) if (a.ids[i] !== b.ids[i] || a.typeIds[i] !== b.typeIds[i]) return false;
  return true;
}

async function identityCheck(): Promise<{ checked: number; mismatches: string[]; decodeMismatches: string[]; decodeDefaultDiffers: number }> {
  const r = rng(0xc0ffee);
  const texts: string[] = ['', ' ', 'Hello, world!', 'unaffable', "Don't stop-believing!!", 'ÀÉÎÕÜ àéîõü', '你好，世界。'];
  for (let i = 0; i < 250; i++) texts.push(makeNastyText(r));
  for (let i = 0; i < 50; i++) texts.push(makeText(r, 8 + Math.floor(r() * 120)));
  const mismatches: string[] = [];
  const decodeMismatches: string[] = [];
  let decodeDefaultDiffers = 0;
  let checked = 0;
  for (const t of texts) {
    const a = jsEncode(t);
    const b = await rsEncode(t);
    checked++;
    if (!sameIds(a, b)) mismatches.push(`single ${JSON.stringify(t.slice(0, 80))}: js=[${a.ids.join(',')}] rust=[${b.ids.join(',')}]`);
    const ids = Array.from(b.ids);
    if (ids.length > 2) {
      // the JS library's default also applies transformers' clean_up_tokenization ("don ' t" -> "don't");
      // the Rust decoder does not: compare both settings
      const dr = await rs.decode(ids, true);
      const dj = js.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
      const dd = js.decode(ids, { skip_special_tokens: true });
      if (dj !== dr) decodeMismatches.push(`${JSON.stringify(t.slice(0, 60))}: js=${JSON.stringify(dj.slice(0, 80))} rust=${JSON.stringify(dr.slice(0, 80))}`);
      if (dd !== dr) decodeDefaultDiffers++;
    }
  }
  for (let i = 0; i + 1 < texts.length && i < 200; i += 2) {
    const a = jsEncode(texts[i]!, texts[i + 1]!);
    const b = await rsEncode(texts[i]!, texts[i + 1]!);
    checked++;
    if (!sameIds(a, b)) mismatches.push(`pair #${i}: js=[${a.ids.join(',')}] rust=[${b.ids.join(',')}]`);
  }
  // the batch API must agree with one-by-one
  const batch = texts.slice(0, 64);
  const rb = await rsEncodeBatch(batch);
  for (let i = 0; i < batch.length; i++) {
    checked++;
    if (!sameIds(rb[i]!, jsEncode(batch[i]!))) mismatches.push(`batch #${i} ${JSON.stringify(batch[i]!.slice(0, 60))}`);
  }
  return { checked, mismatches, decodeMismatches, decodeDefaultDiffers };
}

// ---------------------------------------------------------------- timing

interface Sample {
  texts: number;
  wallMs: number;
  loopMs: number;
  cpuMs: number;
}

async function measure(budgetMs: number, texts: number, fn: () => unknown): Promise<Sample> {
  const elu0 = performance.eventLoopUtilization();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  let done = 0;
  do {
    const p = fn();
    if (p instanceof Promise) await p;
    done += texts;
  } while (performance.now() - t0 < budgetMs);
  const wallMs = performance.now() - t0;
  // let the loop tick once so ELU accounts for the last stretch
  await new Promise((res) => setImmediate(res));
  const elu = performance.eventLoopUtilization(elu0);
  const cpu = process.cpuUsage(cpu0);
  return { texts: done, wallMs, loopMs: elu.active, cpuMs: (cpu.user + cpu.system) / 1000 };
}

interface Scenario {
  name: string;
  js: () => unknown;
  rust: () => unknown;
  textsPerCall: number;
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
}

interface Row {
  scenario: string;
  lib: 'js' | 'rust';
  wallUs: number;
  perSec: number;
  loopUs: number;
  cpuUs: number;
}

async function runScenarios(scenarios: Scenario[], rounds: number, budgetMs: number): Promise<Row[]> {
  const samples = new Map<string, Sample[]>();
  // warm-up: both libraries, every scenario
  for (const s of scenarios) {
    await measure(budgetMs / 2, s.textsPerCall, s.js);
    await measure(budgetMs / 2, s.textsPerCall, s.rust);
  }
  for (let round = 0; round < rounds; round++) {
    for (const s of scenarios) {
      const order: Array<'js' | 'rust'> = round % 2 === 0 ? ['js', 'rust'] : ['rust', 'js'];
      for (const lib of order) {
        const sample = await measure(budgetMs, s.textsPerCall, lib === 'js' ? s.js : s.rust);
        const key = `${s.name}\u0000${lib}`;
        samples.set(key, [...(samples.get(key) ?? []), sample]);
      }
    }
  }
  const rows: Row[] = [];
  for (const s of scenarios) {
    for (const lib of ['js', 'rust'] as const) {
      const ss = samples.get(`${s.name}\u0000${lib}`)!;
      rows.push({
        scenario: s.name,
        lib,
        wallUs: median(ss.map((x) => (x.wallMs * 1000) / x.texts)),
        perSec: median(ss.map((x) => x.texts / (x.wallMs / 1000))),
        loopUs: median(ss.map((x) => (x.loopMs * 1000) / x.texts)),
        cpuUs: median(ss.map((x) => (x.cpuMs * 1000) / x.texts)),
      });
    }
  }
  return rows;
}

// ---------------------------------------------------------------- install size, cold load

function walkBytes(dir: string): number {
  let total = 0;
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) total += walkBytes(p);
    else if (e.isFile()) total += statSync(p).size;
  }
  return total;
}

function duKiB(dir: string): number | null {
  try {
    return Number(execFileSync('du', ['-sk', dir], { encoding: 'utf8' }).split(/\s+/)[0]);
  } catch {
    return null;
  }
}

function packageDir(name: string): string {
  // both packages lack (or allow) ./package.json in exports? resolve the entry and walk up.
  let d = dirname(require.resolve(name));
  while (!statSync(join(d, 'package.json'), { throwIfNoEntry: false })) d = dirname(d);
  return d;
}

interface SizeRow {
  lib: string;
  du: string;
  apparent: string;
  note: string;
}

function mb(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(2)} MB`;
}

function installSizes(): SizeRow[] {
  const jsDir = packageDir('@huggingface/tokenizers');
  const rsDir = packageDir('tokenizers');
  const nodeFiles = readdirSync(rsDir).filter((f) => f.endsWith('.node'));
  const nodeBytes = nodeFiles.reduce((n, f) => n + statSync(join(rsDir, f)).size, 0);
  // which binary this machine loads (napi-rs naming)
  const want = `tokenizers.${platform()}-${arch()}${platform() === 'linux' ? '-gnu' : ''}.node`;
  const mine = nodeFiles.includes(want) ? statSync(join(rsDir, want)).size : 0;
  const sizeOf = (d: string) => {
    const k = duKiB(d);
    return k === null ? 'n/a' : mb(k * 1024);
  };
  return [
    {
      lib: '@huggingface/tokenizers',
      du: sizeOf(jsDir),
      apparent: mb(walkBytes(jsDir)),
      note: 'ESM + CJS + minified builds + .d.ts; zero dependencies',
    },
    {
      lib: 'tokenizers',
      du: sizeOf(rsDir),
      apparent: mb(walkBytes(rsDir)),
      note: `${nodeFiles.length} prebuilt .node binaries in the one package (${mb(nodeBytes)}); this machine loads ${want} (${mb(mine)})`,
    },
  ];
}

interface ColdRow {
  lib: string;
  importMs: number;
  constructMs: number;
  firstEncodeMs: number;
  processMs: number;
}

function coldLoad(jsonPath: string, runs: number): ColdRow[] {
  const scripts: Record<string, string> = {
    '@huggingface/tokenizers': `
      import { readFileSync } from 'node:fs';
      const t0 = performance.now();
      const { Tokenizer } = await import('@huggingface/tokenizers');
      const t1 = performance.now();
      const tok = new Tokenizer(JSON.parse(readFileSync(${JSON.stringify(jsonPath)}, 'utf8')), {});
      const t2 = performance.now();
      tok.encode('Hello, world! This is the first request.', { return_token_type_ids: true });
      const t3 = performance.now();
      console.log(JSON.stringify([t1 - t0, t2 - t1, t3 - t2]));`,
    tokenizers: `
      const t0 = performance.now();
      const { Tokenizer } = await import('tokenizers');
      const t1 = performance.now();
      const tok = Tokenizer.fromFile(${JSON.stringify(jsonPath)});
      const t2 = performance.now();
      const e = await tok.encode('Hello, world! This is the first request.');
      e.getIds(); e.getTypeIds();
      const t3 = performance.now();
      console.log(JSON.stringify([t1 - t0, t2 - t1, t3 - t2]));`,
  };
  const acc = new Map<string, number[][]>();
  const libs = Object.keys(scripts);
  for (let i = 0; i < runs; i++) {
    const order = i % 2 === 0 ? libs : [...libs].reverse();
    for (const lib of order) {
      const t0 = performance.now();
      const out = spawnSync(process.execPath, ['--input-type=module', '-e', scripts[lib]!], { cwd: repoRoot, encoding: 'utf8' });
      const procMs = performance.now() - t0;
      if (out.status !== 0) throw new Error(`cold load ${lib} failed: ${out.stderr}`);
      const [a, b, c] = JSON.parse(out.stdout.trim()) as number[];
      acc.set(lib, [...(acc.get(lib) ?? []), [a!, b!, c!, procMs]]);
    }
  }
  return libs.map((lib) => {
    const xs = acc.get(lib)!;
    return {
      lib,
      importMs: median(xs.map((x) => x[0]!)),
      constructMs: median(xs.map((x) => x[1]!)),
      firstEncodeMs: median(xs.map((x) => x[2]!)),
      processMs: median(xs.map((x) => x[3]!)),
    };
  });
}

// ---------------------------------------------------------------- main

function pad(s: string, n: number, right = false): string {
  return right ? s.padStart(n) : s.padEnd(n);
}

function table(head: string[], rows: string[][]): string {
  const w = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (r: string[]) => '| ' + r.map((c, i) => pad(c, w[i]!, i > 0)).join(' | ') + ' |';
  return [line(head), '|' + w.map((n, i) => (i > 0 ? '-'.repeat(n + 1) + ':' : '-'.repeat(n + 2))).join('|') + '|', ...rows.map(line)].join('\n');
}

const fmt = (x: number, d = 1) => x.toFixed(d);

async function main(): Promise<void> {
  const r = rng(42);
  const shortTexts = Array.from({ length: 256 }, () => makeText(r, 8 + Math.floor(r() * 25)));
  const longTexts = Array.from({ length: 64 }, () => makeText(r, 380 + Math.floor(r() * 41)));
  const batch = longTexts.slice(0, 64);
  const avgTokens = (ts: string[]) => ts.reduce((n, t) => n + jsEncode(t).ids.length, 0) / ts.length;

  console.log(`# tokenizers bench: @huggingface/tokenizers (JS) vs tokenizers (Rust N-API)`);
  console.log(`node ${process.version}, ${platform()}-${arch()}, ${cpus().length} cpus (${cpus()[0]?.model ?? '?'}), UV_THREADPOOL_SIZE=${process.env.UV_THREADPOOL_SIZE ?? '4 (default)'}`);
  console.log(`short texts: ${shortTexts.length}, 8-32 words, avg ${fmt(avgTokens(shortTexts))} tokens; long texts: ${longTexts.length}, 380-420 words, avg ${fmt(avgTokens(longTexts))} tokens\n`);

  // identity
  const id = await identityCheck();
  console.log(`## identical ids (single, pair, batch) on ${id.checked} encodings: ${id.mismatches.length} mismatches`);
  for (const m of id.mismatches.slice(0, 20)) console.log('  ' + m);
  console.log(`## identical decode(skip_special_tokens, JS clean_up_tokenization_spaces: false): ${id.decodeMismatches.length} mismatches`);
  for (const m of id.decodeMismatches.slice(0, 10)) console.log('  ' + m);
  console.log(`   (with the JS default clean_up_tokenization_spaces: true, ${id.decodeDefaultDiffers} decodes differ: "don ' t" -> "don't")`);
  console.log();

  let si = 0;
  let li = 0;
  const scenarios: Scenario[] = [
    {
      name: 'short, one at a time',
      textsPerCall: 1,
      js: () => jsEncode(shortTexts[si++ & 255]!),
      rust: () => rsEncode(shortTexts[si++ & 255]!),
    },
    {
      name: 'short, 64 requests in flight',
      textsPerCall: 64,
      js: () => {
        for (let i = 0; i < 64; i++) jsEncode(shortTexts[si++ & 255]!);
      },
      rust: () => Promise.all(Array.from({ length: 64 }, () => rsEncode(shortTexts[si++ & 255]!))),
    },
    {
      name: 'long (~400 words), one at a time',
      textsPerCall: 1,
      js: () => jsEncode(longTexts[li++ & 63]!),
      rust: () => rsEncode(longTexts[li++ & 63]!),
    },
    {
      name: 'batch of 64 long',
      textsPerCall: 64,
      js: () => batch.map((t) => jsEncode(t)),
      rust: () => rsEncodeBatch(batch),
    },
  ];
  const rounds = QUICK ? 2 : 6;
  const budget = QUICK ? 200 : 600;
  const rows = await runScenarios(scenarios, rounds, budget);

  console.log(`## throughput (median of ${rounds} alternating rounds, ${budget} ms each, after warm-up)`);
  console.log(
    table(
      ['scenario', 'lib', 'µs/text', 'texts/s', 'loop µs/text', 'cpu µs/text'],
      rows.map((x) => [x.scenario, x.lib === 'js' ? 'JS @huggingface/tokenizers' : 'Rust tokenizers', fmt(x.wallUs), fmt(x.perSec, 0), fmt(x.loopUs), fmt(x.cpuUs)]),
    ),
  );
  console.log('\n## ratios (JS / Rust: > 1 means Rust is better by that factor; < 1 means JS is better)');
  console.log(
    table(
      ['scenario', 'wall time', 'event-loop time', 'cpu time'],
      scenarios.map((s) => {
        const a = rows.find((x) => x.scenario === s.name && x.lib === 'js')!;
        const b = rows.find((x) => x.scenario === s.name && x.lib === 'rust')!;
        return [s.name, fmt(a.wallUs / b.wallUs, 2), fmt(a.loopUs / b.loopUs, 2), fmt(a.cpuUs / b.cpuUs, 2)];
      }),
    ),
  );

  // the gateway's tokenizer = JS library + special tokens / truncation done in src/core/tokenizer.ts
  const gw = createTokenizer(tokenizerJson);
  const opts = { maxLength: 512, truncate: true };
  const gwShort = await measure(budget * 2, 1, () => gw.encode(shortTexts[si++ & 255]!, opts));
  const gwLong = await measure(budget * 2, 1, () => gw.encode(longTexts[li++ & 63]!, opts));
  const gwBatch = await measure(budget * 2, 64, () => gw.encodeBatch(batch, opts));
  console.log('\n## slabserve gateway tokenizer (src/core/tokenizer.ts: JS library + own specials/truncation, maxLength 512)');
  console.log(
    table(
      ['scenario', 'µs/text', 'texts/s', 'loop µs/text'],
      [
        ['short, encode()', gwShort],
        ['long, encode() (truncated to 512)', gwLong],
        ['batch of 64 long, encodeBatch() (yields every 4 ms)', gwBatch],
      ].map(([n, x]) => {
        const s = x as Sample;
        return [n as string, fmt((s.wallMs * 1000) / s.texts), fmt(s.texts / (s.wallMs / 1000), 0), fmt((s.loopMs * 1000) / s.texts)];
      }),
    ),
  );

  console.log('\n## install size (node_modules folder of each package)');
  console.log(table(['package', 'du -sk', 'apparent', 'what'], installSizes().map((x) => [x.lib, x.du, x.apparent, x.note])));

  const dir = mkdtempSync(join(tmpdir(), 'slabserve-tok-'));
  try {
    const jsonPath = join(dir, 'tokenizer.json');
    writeFileSync(jsonPath, tokenizerJsonString);
    const runs = QUICK ? 3 : 7;
    console.log(`\n## cold load (fresh node process, median of ${runs}, alternating)`);
    console.log(
      table(
        ['package', 'import ms', 'construct ms', 'first encode ms', 'node process total ms'],
        coldLoad(jsonPath, runs).map((x) => [x.lib, fmt(x.importMs), fmt(x.constructMs), fmt(x.firstEncodeMs), fmt(x.processMs)]),
      ),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

await main();
