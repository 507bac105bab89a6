/**
 * @huggingface/tokenizers (pure JS) against tokenizers (Rust, N-API) on the
 * bert-base-uncased tokenizer.json from buildBertTokenizerJson(), each called the
 * way the gateway would; /tokenize's offsets, ours against the Rust library's; the
 * gateway's own tokenizer; install size and cold load. docs/tokenizer.md says how
 * each is measured and what the columns mean.
 *
 *   npx tsc -p tsconfig.json && node dist/bench/micro/tokenizers.js [--quick]   # --help: the options
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir, platform, arch } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { Tokenizer as JsTokenizer } from '@huggingface/tokenizers';
import { Tokenizer as RsTokenizer } from 'tokenizers';
import { createTokenizer, type TokenSpan } from '../../src/core/tokenizer/tokenizer.js';
import { mulberry32 as rng } from '../../models/generator/rng.js';
import { buildBertTokenizerJson, buildByteBpeTokenizerJson, buildUnigramTokenizerJson } from '../../models/generator/tokenizer-json.js';
import { parseOptions, type OptionSpec } from '../args.js';
import { alignedTable, fmt } from '../table.js';
import { machineLine } from '../machine.js';
import { median, roundOrder } from '../suite/phases.js';
import { vocabulary } from '../workloads.js';

const OPTIONS = {
  rounds: { type: 'int', min: 1, default: 6, quick: 2, help: 'alternating rounds of each scenario; the median is reported' },
  'round-ms': { type: 'number', min: 1, value: 'MS', default: 600, quick: 200, help: 'ms each library runs a scenario per round (warm-up: half; the gateway rows: twice)' },
  'cold-runs': { type: 'int', min: 1, default: 7, quick: 3, help: 'fresh node processes per package for the cold load; the median is reported' },
  seed: { type: 'int', min: 0, help: 'seed of the offsets agreement texts (default: a fresh one, printed)' },
  quick: { type: 'boolean', help: 'the shorter defaults marked quick above' },
} as const satisfies Record<string, OptionSpec>;

// ---------------------------------------------------------------- texts

type Vocabulary = ReturnType<typeof vocabulary>;

const PUNCT = [',', '.', ';', ':', '!', '?', "'s", ' -', ' (', ')', '"'];

function pick<T>(r: () => number, xs: readonly T[]): T {
  return xs[Math.floor(r() * xs.length)]!;
}

/** English-looking text from real vocabulary words; some words get a continuation piece glued on. */
function makeText(r: () => number, v: Vocabulary, words: number): string {
  const out: string[] = [];
  let capital = true;
  for (let i = 0; i < words; i++) {
    let w = pick(r, v.words);
    if (r() < 0.15) w += pick(r, v.pieces); // forces a WordPiece split
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
function makeNastyText(r: () => number, v: Vocabulary): string {
  const { words, pieces } = v;
  const parts: string[] = [];
  const n = 1 + Math.floor(r() * 30);
  for (let i = 0; i < n; i++) {
    const k = r();
    if (k < 0.35) parts.push(pick(r, words));
    else if (k < 0.45) parts.push(pick(r, words).toUpperCase());
    else if (k < 0.52) parts.push(pick(r, ['café', 'naïve', 'Ångström', 'résumé', 'Müller', 'façade', 'jalapeño', 'São', 'Łódź', 'e\u0301te\u0301', 'हिन्दी', 'ｶﾞ', 'ㅋㅠ', 'e\u0323\u0301']));
    else if (k < 0.58) {
      let s = '';
      const m = 1 + Math.floor(r() * 6);
      for (let j = 0; j < m; j++) s += String.fromCodePoint(0x4e00 + Math.floor(r() * 0x5200));
      parts.push(s);
    } else if (k < 0.63) parts.push(pick(r, ['日本語', 'ひらがな', 'カタカナ', '한국어', 'Привет', 'مرحبا', 'שלום', 'ελληνικά', 'ไทย']));
    else if (k < 0.70) parts.push(pick(r, ['!', '?!', '...', '--', '"quoted"', "it's", '(x)', '[y]', '{z}', '@user', '#tag', '$5.00', '50%', 'a/b', 'x_y', '~', '`', '^', '|', '\\']));
    else if (k < 0.74) parts.push(pick(r, words).repeat(20 + Math.floor(r() * 20))); // > 100 chars
    else if (k < 0.77) parts.push(pick(r, ['\t', '\n', '\r\n', '\u00a0', '\u200b', '\u0000', '\ufffd', '\u0007', '\u3000', '\u2028']));
    else if (k < 0.80) parts.push(pick(r, ['😀', '👍🏽', '🇫🇷', '❤️', '∑', '€', '©', '½', 'ﬁ', '①']));
    else if (k < 0.83) parts.push(String(Math.floor(r() * 1e9)));
    else if (k < 0.86) parts.push(pick(r, words) + pick(r, pieces) + pick(r, pieces));
    else if (k < 0.88) parts.push('[CLS]', '[SEP]', '[MASK]', '[UNK]', '[PAD]'); // specials written in the text
    else parts.push(pick(r, words) + pick(r, ['.', ',', '!', ';']));
  }
  const sep = () => pick(r, [' ', ' ', ' ', '', '  ']);
  return parts.map((p) => p + sep()).join('');
}

// ---------------------------------------------------------------- adapters

interface Ids {
  ids: Int32Array;
  typeIds: Int32Array;
}

/** Both libraries on the same bert-base-uncased tokenizer.json, each called the way the gateway would. */
class Libraries {
  readonly json = buildBertTokenizerJson();
  readonly jsonString = JSON.stringify(this.json);
  readonly js = new JsTokenizer(this.json, {});
  readonly rs = RsTokenizer.fromString(this.jsonString);

  jsEncode(text: string, pair?: string): Ids {
    const e = this.js.encode(text, { text_pair: pair ?? null, return_token_type_ids: true });
    return { ids: Int32Array.from(e.ids), typeIds: Int32Array.from(e.token_type_ids) };
  }

  async rsEncode(text: string, pair?: string): Promise<Ids> {
    const e = await this.rs.encode(text, pair ?? null);
    return { ids: Int32Array.from(e.getIds()), typeIds: Int32Array.from(e.getTypeIds()) };
  }

  async rsEncodeBatch(texts: string[]): Promise<Ids[]> {
    const es = await this.rs.encodeBatch(texts);
    return es.map((e) => ({ ids: Int32Array.from(e.getIds()), typeIds: Int32Array.from(e.getTypeIds()) }));
  }
}

// ---------------------------------------------------------------- identity check

function sameIds(a: Ids, b: Ids): boolean {
  if (a.ids.length !== b.ids.length) return false;
  for (let i = 0; i < a.ids.length; i++) if (a.ids[i] !== b.ids[i] || a.typeIds[i] !== b.typeIds[i]) return false;
  return true;
}

interface Identity {
  checked: number;
  mismatches: string[];
  decodeMismatches: string[];
  decodeDefaultDiffers: number;
}

/** The texts the libraries must agree on: edge cases, then stress texts, then plain ones. */
function identityTexts(v: Vocabulary): string[] {
  const r = rng(0xc0ffee);
  const texts: string[] = ['', ' ', 'Hello, world!', 'unaffable', "Don't stop-believing!!", 'ÀÉÎÕÜ àéîõü', '你好，世界。'];
  for (let i = 0; i < 250; i++) texts.push(makeNastyText(r, v));
  for (let i = 0; i < 50; i++) texts.push(makeText(r, v, 8 + Math.floor(r() * 120)));
  return texts;
}

/** Same ids from both libraries (single, pair, batch), and the same decoded text. */
async function identityCheck(lib: Libraries, v: Vocabulary): Promise<Identity> {
  const texts = identityTexts(v);
  const mismatches: string[] = [];
  const decodeMismatches: string[] = [];
  let decodeDefaultDiffers = 0;
  let checked = 0;
  for (const t of texts) {
    const a = lib.jsEncode(t);
    const b = await lib.rsEncode(t);
    checked++;
    if (!sameIds(a, b)) mismatches.push(`single ${JSON.stringify(t.slice(0, 80))}: js=[${a.ids.join(',')}] rust=[${b.ids.join(',')}]`);
    const ids = Array.from(b.ids);
    if (ids.length > 2) {
      // the JS library's default also applies transformers' clean_up_tokenization ("don ' t" -> "don't");
      // the Rust decoder does not: compare both settings
      const dr = await lib.rs.decode(ids, true);
      const dj = lib.js.decode(ids, { skip_special_tokens: true, clean_up_tokenization_spaces: false });
      const dd = lib.js.decode(ids, { skip_special_tokens: true });
      if (dj !== dr) decodeMismatches.push(`${JSON.stringify(t.slice(0, 60))}: js=${JSON.stringify(dj.slice(0, 80))} rust=${JSON.stringify(dr.slice(0, 80))}`);
      if (dd !== dr) decodeDefaultDiffers++;
    }
  }
  for (let i = 0; i + 1 < texts.length && i < 200; i += 2) {
    const a = lib.jsEncode(texts[i]!, texts[i + 1]!);
    const b = await lib.rsEncode(texts[i]!, texts[i + 1]!);
    checked++;
    if (!sameIds(a, b)) mismatches.push(`pair #${i}: js=[${a.ids.join(',')}] rust=[${b.ids.join(',')}]`);
  }
  // the batch API must agree with one-by-one
  const batch = texts.slice(0, 64);
  const rb = await lib.rsEncodeBatch(batch);
  for (let i = 0; i < batch.length; i++) {
    checked++;
    if (!sameIds(rb[i]!, lib.jsEncode(batch[i]!))) mismatches.push(`batch #${i} ${JSON.stringify(batch[i]!.slice(0, 60))}`);
  }
  return { checked, mismatches, decodeMismatches, decodeDefaultDiffers };
}

// ---------------------------------------------------------------- /tokenize offsets

/** /tokenize's answer the Rust way: its ids and offsets, each token's text cut from the text as ours does. */
async function rsTokenize(rs: RsTokenizer, text: string): Promise<TokenSpan[]> {
  const e = await rs.encode(text);
  const [ids, offsets, special, tokens] = [e.getIds(), e.getOffsets(), e.getSpecialTokensMask(), e.getTokens()];
  const chars = Array.from(text);
  return ids.map((id, i) => {
    const [start, stop] = offsets[i]!;
    if (special[i]) return { id, text: tokens[i]!, special: true, start: null, stop: null };
    return { id, text: chars.slice(start, stop).join(''), special: false, start: start!, stop: stop! };
  });
}

/** Ours against the Rust library's offsets on fresh stress texts, per tokenizer layout (texts whose ids differ are counted apart). */
async function offsetsAgreement(v: Vocabulary, seed: number, count: number): Promise<void> {
  console.log(`## /tokenize offsets, ours vs the Rust library's, on ${count} stress texts per tokenizer (seed ${seed})`);
  const layouts: [string, object][] = [
    ['BERT (BertNormalizer, WordPiece)', buildBertTokenizerJson()],
    ['XLM-R (NFKC, Metaspace, Unigram)', buildUnigramTokenizerJson().json],
    ['Qwen3 (NFC, ByteLevel BPE)', buildByteBpeTokenizerJson().json],
  ];
  for (const [name, json] of layouts) {
    const ours = createTokenizer(json);
    const rs = RsTokenizer.fromString(JSON.stringify(json));
    const r = rng(seed);
    let [idsDiffer, differ, tokens] = [0, 0, 0];
    const shown: string[] = [];
    for (let i = 0; i < count; i++) {
      const text = makeNastyText(r, v);
      const [a, b] = [ours.tokenize!(text, true), await rsTokenize(rs, text)];
      if (a.map((t) => t.id).join() !== b.map((t) => t.id).join()) idsDiffer++;
      else if (JSON.stringify(a) !== JSON.stringify(b)) {
        differ++;
        const k = a.findIndex((t, j) => t.start !== b[j]!.start || t.stop !== b[j]!.stop);
        if (shown.length < 3) shown.push(`${JSON.stringify(text.slice(0, 60))} token ${k}: ours ${a[k]?.start}-${a[k]?.stop}, rust ${b[k]?.start}-${b[k]?.stop}`);
      }
      tokens += a.length;
    }
    console.log(`  ${name}: ${tokens} tokens; offsets differ on ${differ} texts (${idsDiffer} more have different ids)`);
    for (const x of shown) console.log(`    ${x}`);
  }
  console.log();
}

function offsetsScenarios(lib: Libraries, texts: BenchTexts): Scenario[] {
  const gw = createTokenizer(lib.json);
  return [
    { name: '/tokenize short: ids + offsets', textsPerCall: 1, js: () => gw.tokenize!(texts.nextShort(), true), rust: () => rsTokenize(lib.rs, texts.nextShort()) },
    { name: '/tokenize long: ids + offsets', textsPerCall: 1, js: () => gw.tokenize!(texts.nextLong(), true), rust: () => rsTokenize(lib.rs, texts.nextLong()) },
  ];
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

interface Row {
  scenario: string;
  lib: 'js' | 'rust';
  wallUs: number;
  perSec: number;
  loopUs: number;
  cpuUs: number;
}

const LIBS = ['js', 'rust'] as const;

async function runScenarios(scenarios: Scenario[], rounds: number, budgetMs: number): Promise<Row[]> {
  const samples = new Map<string, Sample[]>();
  // warm-up: both libraries, every scenario
  for (const s of scenarios) {
    await measure(budgetMs / 2, s.textsPerCall, s.js);
    await measure(budgetMs / 2, s.textsPerCall, s.rust);
  }
  for (let round = 1; round <= rounds; round++) {
    for (const s of scenarios) {
      for (const lib of roundOrder(round, 2).map((i) => LIBS[i]!)) {
        const sample = await measure(budgetMs, s.textsPerCall, lib === 'js' ? s.js : s.rust);
        const key = `${s.name}\u0000${lib}`;
        samples.set(key, [...(samples.get(key) ?? []), sample]);
      }
    }
  }
  const rows: Row[] = [];
  for (const s of scenarios) {
    for (const lib of LIBS) {
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

/** `du -sk` of a folder, in MB. */
function duMb(dir: string): string {
  try {
    return mb(Number(execFileSync('du', ['-sk', dir], { encoding: 'utf8' }).split(/\s+/)[0]) * 1024);
  } catch {
    return 'n/a';
  }
}

function packageDir(name: string): string {
  // both packages lack (or allow) ./package.json in exports? resolve the entry and walk up.
  let d = dirname(createRequire(import.meta.url).resolve(name));
  while (!statSync(join(d, 'package.json'), { throwIfNoEntry: false })) d = dirname(d);
  return d;
}

function mb(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(2)} MB`;
}

/** The install size table: each package's node_modules folder, and what is in it. */
function printInstallSizes(): void {
  const jsDir = packageDir('@huggingface/tokenizers');
  const rsDir = packageDir('tokenizers');
  const nodeFiles = readdirSync(rsDir).filter((f) => f.endsWith('.node'));
  const nodeBytes = nodeFiles.reduce((n, f) => n + statSync(join(rsDir, f)).size, 0);
  // which binary this machine loads (napi-rs naming)
  const want = `tokenizers.${platform()}-${arch()}${platform() === 'linux' ? '-gnu' : ''}.node`;
  const mine = nodeFiles.includes(want) ? statSync(join(rsDir, want)).size : 0;
  const rows = [
    ['@huggingface/tokenizers', duMb(jsDir), 'ESM + CJS + minified builds + .d.ts; zero dependencies'],
    ['tokenizers', duMb(rsDir), `${nodeFiles.length} prebuilt .node binaries in the one package (${mb(nodeBytes)}); this machine loads ${want} (${mb(mine)})`],
  ];
  console.log('\n## install size (node_modules folder of each package)');
  console.log(alignedTable(['package', 'du -sk', 'what'], rows));
}

/** The cold-load table's rows: each package, then the medians of its import, construct, first encode and whole-process ms. */
function coldLoad(jsonPath: string, runs: number): string[][] {
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
  const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..'); // dist/bench/micro/tokenizers.js -> the repo root
  const acc = new Map<string, number[][]>();
  const libs = Object.keys(scripts);
  for (let i = 1; i <= runs; i++) {
    for (const lib of roundOrder(i, libs.length).map((k) => libs[k]!)) {
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
    return [lib, ...[0, 1, 2, 3].map((k) => fmt(median(xs.map((x) => x[k]!)), 1))];
  });
}

// ---------------------------------------------------------------- main

/** The timed texts, and the cursors the scenarios (then the gateway rows) walk through them with. */
class BenchTexts {
  readonly short: string[];
  readonly long: string[];
  private si = 0;
  private li = 0;

  constructor(v: Vocabulary) {
    const r = rng(42);
    this.short = Array.from({ length: 256 }, () => makeText(r, v, 8 + Math.floor(r() * 25)));
    this.long = Array.from({ length: 64 }, () => makeText(r, v, 380 + Math.floor(r() * 41)));
  }

  nextShort(): string {
    return this.short[this.si++ & 255]!;
  }

  nextLong(): string {
    return this.long[this.li++ & 63]!;
  }
}

function printHeader(lib: Libraries, texts: BenchTexts): void {
  const avgTokens = (ts: string[]) => ts.reduce((n, t) => n + lib.jsEncode(t).ids.length, 0) / ts.length;
  console.log(`# tokenizers bench: @huggingface/tokenizers (JS) vs tokenizers (Rust N-API)`);
  console.log(`${machineLine()}, UV_THREADPOOL_SIZE=${process.env.UV_THREADPOOL_SIZE ?? '4 (default)'}`);
  console.log(
    `short texts: ${texts.short.length}, 8-32 words, avg ${fmt(avgTokens(texts.short), 1)} tokens; long texts: ${texts.long.length}, 380-420 words, avg ${fmt(avgTokens(texts.long), 1)} tokens\n`,
  );
}

function printIdentity(id: Identity): void {
  console.log(`## identical ids (single, pair, batch) on ${id.checked} encodings: ${id.mismatches.length} mismatches`);
  for (const m of id.mismatches.slice(0, 20)) console.log('  ' + m);
  console.log(`## identical decode(skip_special_tokens, JS clean_up_tokenization_spaces: false): ${id.decodeMismatches.length} mismatches`);
  for (const m of id.decodeMismatches.slice(0, 10)) console.log('  ' + m);
  console.log(`   (with the JS default clean_up_tokenization_spaces: true, ${id.decodeDefaultDiffers} decodes differ: "don ' t" -> "don't")`);
  console.log();
}

function libraryScenarios(lib: Libraries, texts: BenchTexts): Scenario[] {
  return [
    {
      name: 'short, one at a time',
      textsPerCall: 1,
      js: () => lib.jsEncode(texts.nextShort()),
      rust: () => lib.rsEncode(texts.nextShort()),
    },
    {
      name: 'short, 64 requests in flight',
      textsPerCall: 64,
      js: () => {
        for (let i = 0; i < 64; i++) lib.jsEncode(texts.nextShort());
      },
      rust: () => Promise.all(Array.from({ length: 64 }, () => lib.rsEncode(texts.nextShort()))),
    },
    {
      name: 'long (~400 words), one at a time',
      textsPerCall: 1,
      js: () => lib.jsEncode(texts.nextLong()),
      rust: () => lib.rsEncode(texts.nextLong()),
    },
    {
      name: 'batch of 64 long',
      textsPerCall: 64,
      js: () => texts.long.map((t) => lib.jsEncode(t)),
      rust: () => lib.rsEncodeBatch(texts.long),
    },
  ];
}

function printThroughput(scenarios: Scenario[], rows: Row[], rounds: number, roundMs: number): void {
  console.log(`## throughput (median of ${rounds} alternating rounds, ${roundMs} ms each, after warm-up)`);
  console.log(
    alignedTable(
      ['scenario', 'lib', 'µs/text', 'texts/s', 'loop µs/text', 'cpu µs/text'],
      rows.map((x) => [x.scenario, x.lib === 'js' ? (x.scenario.startsWith('/tokenize') ? 'JS + token-offsets.ts' : 'JS @huggingface/tokenizers') : 'Rust tokenizers', fmt(x.wallUs, 1), fmt(x.perSec, 0), fmt(x.loopUs, 1), fmt(x.cpuUs, 1)]),
    ),
  );
  console.log('\n## ratios (JS / Rust: > 1 means Rust is better by that factor; < 1 means JS is better)');
  console.log(
    alignedTable(
      ['scenario', 'wall time', 'event-loop time', 'cpu time'],
      scenarios.map((s) => {
        const a = rows.find((x) => x.scenario === s.name && x.lib === 'js')!;
        const b = rows.find((x) => x.scenario === s.name && x.lib === 'rust')!;
        return [s.name, fmt(a.wallUs / b.wallUs, 2), fmt(a.loopUs / b.loopUs, 2), fmt(a.cpuUs / b.cpuUs, 2)];
      }),
    ),
  );
}

/** The gateway's tokenizer: the ASCII fast path or the JS library, then special tokens / truncation done in src/core/tokenizer/tokenizer.ts; beside it the library alone. */
async function measureGateway(lib: Libraries, texts: BenchTexts, budgetMs: number): Promise<void> {
  const gw = createTokenizer(lib.json);
  const libraryOnly = createTokenizer(lib.json, { asciiFastPath: false });
  const opts = { maxLength: 512, truncate: true };
  const rows: [string, Sample][] = [
    ['short, encode()', await measure(budgetMs, 1, () => gw.encode(texts.nextShort(), opts))],
    ['short, encode(), library only (no ASCII fast path)', await measure(budgetMs, 1, () => libraryOnly.encode(texts.nextShort(), opts))],
    ['long, encode() (truncated to 512)', await measure(budgetMs, 1, () => gw.encode(texts.nextLong(), opts))],
    ['batch of 64 long, encodeBatch() (yields every 4 ms)', await measure(budgetMs, 64, () => gw.encodeBatch(texts.long, opts))],
  ];
  console.log('\n## slabserve gateway tokenizer (src/core/tokenizer/tokenizer.ts: ASCII fast path or JS library, own specials/truncation, maxLength 512)');
  console.log(
    alignedTable(
      ['scenario', 'µs/text', 'texts/s', 'loop µs/text'],
      rows.map(([name, s]) => [name, fmt((s.wallMs * 1000) / s.texts, 1), fmt(s.texts / (s.wallMs / 1000), 0), fmt((s.loopMs * 1000) / s.texts, 1)]),
    ),
  );
}

/** Cold load from a tokenizer.json file in a temporary folder. */
function printColdLoad(lib: Libraries, runs: number): void {
  const dir = mkdtempSync(join(tmpdir(), 'slabserve-tok-'));
  try {
    const jsonPath = join(dir, 'tokenizer.json');
    writeFileSync(jsonPath, lib.jsonString);
    console.log(`\n## cold load (fresh node process, median of ${runs}, alternating)`);
    console.log(
      alignedTable(
        ['package', 'import ms', 'construct ms', 'first encode ms', 'node process total ms'],
        coldLoad(jsonPath, runs),
      ),
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const opts = parseOptions('node dist/bench/micro/tokenizers.js [options]', OPTIONS);
  const vocab = vocabulary();
  const lib = new Libraries();
  const texts = new BenchTexts(vocab);
  printHeader(lib, texts);
  printIdentity(await identityCheck(lib, vocab));
  await offsetsAgreement(vocab, opts.seed ?? Math.floor(Math.random() * 2 ** 31), 300);
  const scenarios = [...libraryScenarios(lib, texts), ...offsetsScenarios(lib, texts)];
  const rows = await runScenarios(scenarios, opts.rounds, opts['round-ms']);
  printThroughput(scenarios, rows, opts.rounds, opts['round-ms']);
  await measureGateway(lib, texts, opts['round-ms'] * 2);
  printInstallSizes();
  printColdLoad(lib, opts['cold-runs']);
}

await main();
