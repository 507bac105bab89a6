/**
 * Models served by their Hugging Face Hub id, fetched from a stand-in for the
 * Hub (test/fixtures/hub-server.ts: huggingface.co's routes, headers, errors
 * and CDN redirects) into a Hugging Face cache of the test's own:
 *
 * - served by id, the rows equal the unmodified graph's, run alone and pooled here;
 * - only the files the model needs are requested (the repository's decoys never);
 * - the cache is huggingface_hub's layout, and one laid out by hand as it lays it
 *   out is served without a request; offline, and with the Hub gone, from the cache;
 * - revisions (a tag, a commit), a gated repository (token or not, the token never
 *   sent to the CDN), missing repositories and revisions, a transfer cut and resumed,
 *   a corrupt file fetched again, two processes sharing one download;
 * - the model's names: its repository id in a request, its short name in URLs,
 *   --served-model-name, and two ids with one short name refused;
 * - `slabserve download`, into the cache and as plain folders.
 */
import { execFile, spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync, statfsSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import OpenAI from 'openai';
import { loadTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { createEngine, type Engine } from '../dist/src/index.js';
import { startServer } from '../dist/src/main/server.js';
import { fetchModel } from '../dist/src/main/hub/fetch-model.js';
import { RepoCache } from '../dist/src/main/hub/cache.js';
import { downloadFile } from '../dist/src/main/hub/download.js';
import { hfEnv } from '../dist/src/main/hub/hf-env.js';
import { parseHubId } from '../dist/src/main/hub/hub-id.js';
import { pickFiles } from '../dist/src/main/hub/pick-files.js';
import { downloadProgress } from '../dist/src/main/hub/progress.js';
import { checkpointOf } from './fixtures/checkpoint-of.js';
import { startHub, type FakeHub, type FileContent, type LoggedRequest } from './fixtures/hub-server.js';
import { serveCli } from './cli-process.js';
import { eventually, makeRandom, maxAbsDiff, whenFileSize, modelsDir, PlainReference, randomTexts, testServerConfig, vocabularyWords } from './helpers.js';

const run = promisify(execFile);
const CLI = join(dirname(modelsDir), 'dist', 'src', 'cli.js');
const TOKEN = 'hf_test_token_with_access_0123456789';
const OTHER_TOKEN = 'hf_test_token_without_access_98765';

/** A generated model folder's files, as a repository holds them (the graph in LFS). */
function repoFiles(model: string): Record<string, FileContent> {
  const dir = join(modelsDir, model);
  const files: Record<string, FileContent> = {};
  for (const name of readdirSync(dir)) files[name] = name.endsWith('.onnx') ? { lfs: readFileSync(join(dir, name)) } : readFileSync(join(dir, name));
  return files;
}

function withoutGraph(files: Record<string, FileContent>): Record<string, FileContent> {
  return Object.fromEntries(Object.entries(files).filter(([name]) => !name.endsWith('.onnx')));
}

/** What a repository holds beside the model that slabserve must never fetch. */
function decoys(rand: () => number): Record<string, FileContent> {
  const bytes = (n: number) => Buffer.from(Array.from({ length: n }, () => Math.floor(rand() * 256)));
  return {
    'README.md': Buffer.from('# a model card\n'),
    'onnx/model_O4.onnx': { lfs: bytes(3000) },
    'onnx/model_fp16.onnx': { lfs: bytes(2000) },
    'openvino/openvino_model.bin': { lfs: bytes(2000) },
    'pytorch_model.bin': { lfs: bytes(4000) },
    'model.safetensors': { lfs: bytes(4000) },
  };
}

const NEEDED = ['config.json', 'model.onnx', 'serve.json', 'tokenizer.json', 'tokenizer_config.json'];

let hub: FakeHub;
let home: string;
const savedEnv = { ...process.env };

/** A fresh cache, the Hub at the fake; `over` sets or (undefined) clears variables. */
function hfEnvironment(over: Record<string, string | undefined> = {}): string {
  const cache = mkdtempSync(join(home, 'cache-'));
  for (const k of ['HF_TOKEN', 'HF_HUB_OFFLINE', 'HF_HOME', 'HUGGING_FACE_HUB_TOKEN', 'TRANSFORMERS_OFFLINE']) delete process.env[k];
  Object.assign(process.env, { HF_ENDPOINT: hub.url, HF_HUB_CACHE: cache, HF_HOME: join(home, 'hf-home') });
  for (const [k, v] of Object.entries(over)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  return cache;
}

const filesAsked = (log: LoggedRequest[]) => [...new Set(log.filter((r) => r.kind === 'resolve' && r.method === 'GET').map((r) => r.file!))].sort();
const noBackoff = async () => {};

beforeAll(async () => {
  const rand = makeRandom('hub models');
  home = mkdtempSync(join(tmpdir(), 'slabserve-hub-'));
  const embed = { ...repoFiles('tiny-embed'), ...decoys(rand) };
  hub = await startHub({
    repos: {
      // v1 (commit 0) is the embedding model; main (commit 1) became the intent classifier.
      'acme/tiny-embed': { commits: [{ files: embed }, { files: { ...repoFiles('tiny-intent'), ...decoys(rand) } }], tags: { v1: 0 } },
      'acme/embed-only': { commits: [{ files: embed }] },
      'other/embed-only': { commits: [{ files: embed }] },
      'acme/gated-embed': { commits: [{ files: embed }], gated: 'manual', access: [TOKEN] },
      'acme/no-graph': { commits: [{ files: { 'config.json': readFileSync(join(modelsDir, 'tiny-embed', 'config.json')), 'README.md': Buffer.from('x') } }] },
      // tiny-embed's weights as a PyTorch checkpoint, no graph (what most Hub repositories hold), and a .bin beside it never fetched.
      'acme/checkpoint-only': { commits: [{ files: { ...withoutGraph(repoFiles('tiny-embed')), 'model.safetensors': { lfs: Buffer.from(checkpointOf(join(modelsDir, 'tiny-embed', 'model.onnx'))) }, 'pytorch_model.bin': { lfs: Buffer.from('not read') } } }] },
    },
    tokens: [TOKEN, OTHER_TOKEN],
  });
});

afterAll(async () => {
  process.env = savedEnv;
  await hub?.close();
  rmSync(home, { recursive: true, force: true });
});

afterEach(() => hub.clearLog());

/** `model`'s rows of random texts from `engine`, each within `bound` of `ref`'s (the unmodified graph run alone). */
async function expectReferenceRows(engine: Engine, model: string, ref: PlainReference, label: string, count: number, bound: number): Promise<{ texts: string[]; rows: Float32Array[] }> {
  const tok = await loadTokenizer(ref.spec.tokenizerPath);
  const texts = randomTexts(makeRandom(label), vocabularyWords(ref.spec), count, 30);
  const rows = await engine.embed(texts, { model });
  for (const [i, text] of texts.entries()) {
    const expected = await ref.embedding(tok.encode(text, { maxLength: ref.spec.maxLength, truncate: false }).ids);
    expect(maxAbsDiff(rows[i]!, expected), text).toBeLessThan(bound);
  }
  return { texts, rows };
}

describe('a model served by its Hub id', () => {
  it('answers with the rows of the unmodified graph, fetching only the files it needs into a huggingface_hub cache', { timeout: 120_000 }, async () => {
    const cache = hfEnvironment();
    const engine = await createEngine({ device: 'cpu', models: ['acme/embed-only'], log: () => {} });
    const ref = await PlainReference.open('tiny-embed');
    try {
      const [info] = engine.info();
      const commit = hub.revisionSha('acme/embed-only', 'main');
      expect(info).toMatchObject({ name: 'embed-only', hub: { repo: 'acme/embed-only', revision: 'main', commit } });
      const { texts, rows } = await expectReferenceRows(engine, 'acme/embed-only', ref, 'hub rows', 12, 1e-4);
      // By its short name too: the same rows.
      expect(maxAbsDiff((await engine.embed(texts[0]!, { model: 'embed-only' }))[0]!, rows[0]!)).toBeLessThan(1e-6);
      expect(filesAsked(hub.log)).toEqual(NEEDED);
      // huggingface_hub's layout: blobs by etag, snapshots/<commit>/ of relative links, refs/main.
      const repo = join(cache, 'models--acme--embed-only');
      expect(readFileSync(join(repo, 'refs', 'main'), 'utf8')).toBe(commit);
      for (const file of NEEDED) {
        const link = join(repo, 'snapshots', commit, file);
        expect(lstatSync(link).isSymbolicLink()).toBe(true);
        const target = readlinkSync(link);
        expect(target.startsWith('../../blobs/')).toBe(true);
        const bytes = readFileSync(join(modelsDir, 'tiny-embed', file));
        const etag = file.endsWith('.onnx') ? createHash('sha256').update(bytes).digest('hex') : createHash('sha1').update(`blob ${bytes.length}\0`).update(bytes).digest('hex');
        expect(target).toBe(`../../blobs/${etag}`);
      }
      expect(readdirSync(join(repo, 'blobs')).filter((f) => f.includes('.incomplete'))).toEqual([]);
    } finally {
      await engine.close();
      await ref.close();
    }
  });

  it('a repository with a checkpoint and no graph: the checkpoint is fetched (safetensors, not the .bin beside it) and served from a graph built from it, with the rows of the same weights as a graph', { timeout: 120_000 }, async () => {
    hfEnvironment();
    const graphs = mkdtempSync(join(home, 'graphs-'));
    const logs: string[] = [];
    const engine = await createEngine({ device: 'cpu', models: ['acme/checkpoint-only'], graphCacheDir: graphs, log: (l) => logs.push(l) });
    const ref = await PlainReference.open('tiny-embed');
    try {
      expect(filesAsked(hub.log)).toEqual(['config.json', 'model.safetensors', 'serve.json', 'tokenizer.json', 'tokenizer_config.json']);
      expect(logs.some((l) => /built its graph from model\.safetensors \(BertModel/.test(l))).toBe(true);
      await expectReferenceRows(engine, 'acme/checkpoint-only', ref, 'hub checkpoint rows', 8, 1e-5);
    } finally {
      await engine.close();
      await ref.close();
    }
  });

  it('serves a cache laid out as huggingface_hub lays it out without a request: pinned to a commit, or offline with the Hub gone', { timeout: 120_000 }, async () => {
    const cache = hfEnvironment();
    const commit = hub.revisionSha('acme/embed-only', 'main');
    // Laid out by hand, as `hf download` leaves it.
    const repo = join(cache, 'models--acme--embed-only');
    for (const file of NEEDED) {
      const bytes = readFileSync(join(modelsDir, 'tiny-embed', file));
      const etag = createHash('sha256').update(bytes).digest('hex');
      mkdirSync(join(repo, 'blobs'), { recursive: true });
      writeFileSync(join(repo, 'blobs', etag), bytes);
      const link = join(repo, 'snapshots', commit, file);
      mkdirSync(dirname(link), { recursive: true });
      symlinkSync(relative(dirname(link), join(repo, 'blobs', etag)), link);
    }
    mkdirSync(join(repo, 'refs'));
    writeFileSync(join(repo, 'refs', 'main'), commit);
    for (const [given, env] of [[`acme/embed-only@${commit}`, {}], ['acme/embed-only', { HF_HUB_OFFLINE: '1' }]] as const) {
      Object.assign(process.env, env);
      await hub.offline();
      try {
        const engine = await createEngine({ device: 'cpu', models: [given], log: () => {} });
        expect(engine.info()[0]!.hub).toEqual({ repo: 'acme/embed-only', revision: given.includes('@') ? commit : 'main', commit });
        expect((await engine.embed('where is my parcel'))[0]!.length).toBe(engine.info()[0]!.dimension);
        await engine.close();
      } finally {
        await hub.online();
      }
    }
    expect(hub.log).toEqual([]);
  });

  it('offline with nothing cached, or the Hub out of reach with nothing cached: a message that says what to do', { timeout: 60_000 }, async () => {
    hfEnvironment({ HF_HUB_OFFLINE: '1' });
    await expect(createEngine({ device: 'cpu', models: ['acme/embed-only'], log: () => {} })).rejects.toThrow(/HF_HUB_OFFLINE is set, and the cache \(.*\) has never fetched revision main of it: fetch it first \(slabserve download acme\/embed-only\)/);
    // Reachable, fetched once; then out of reach: served from the cache, with a warning.
    const env = hfEnv({ ...process.env, HF_HUB_OFFLINE: undefined, HF_HUB_CACHE: mkdtempSync(join(home, 'cache-')) });
    const id = parseHubId('acme/embed-only')!;
    const lines: string[] = [];
    const opts = { env, overrides: {}, log: (l: string) => lines.push(l), backoff: noBackoff };
    const first = await fetchModel(id, opts);
    await hub.offline();
    try {
      const again = await fetchModel(id, opts);
      expect(again).toMatchObject({ commit: first.commit, dir: first.dir, online: false });
      expect(lines.join('\n')).toMatch(/the Hub at http:\/\/127\.0\.0\.1:\d+ failed 5 times .*; serving acme\/embed-only from the cache/);
      await expect(fetchModel({ repo: 'acme/gated-embed', revision: 'main' }, opts)).rejects.toThrow(/failed 5 times .*, and the cache .* has never fetched revision main of it/);
    } finally {
      await hub.online();
    }
  });

  it('pins a revision: a tag and a commit serve what they name, and the resolved commit is what /info and the log say', { timeout: 120_000 }, async () => {
    hfEnvironment();
    const v1 = hub.revisionSha('acme/tiny-embed', 'v1');
    const lines: string[] = [];
    const engine = await createEngine({ device: 'cpu', models: ['acme/tiny-embed@v1', 'acme/tiny-embed'], servedModelNames: ['embed-v1', 'intent-main'], log: (l) => lines.push(l) });
    try {
      const [a, b] = engine.info();
      expect(a).toMatchObject({ name: 'embed-v1', task: 'embed', hub: { revision: 'v1', commit: v1 } });
      expect(b).toMatchObject({ name: 'intent-main', task: 'classify', hub: { revision: 'main', commit: hub.revisionSha('acme/tiny-embed', 'main') } });
      expect(lines.join('\n')).toContain(`model acme/tiny-embed@v1: commit ${v1}, from the Hub`);
    } finally {
      await engine.close();
    }
    const byCommit = await createEngine({ device: 'cpu', models: [`acme/tiny-embed@${v1}`], log: () => {} });
    expect(byCommit.info()[0]).toMatchObject({ name: 'tiny-embed', task: 'embed', hub: { commit: v1 } });
    await byCommit.close();
  });

  it('refuses, before serving, what cannot be served: no such repository or revision, a gated one without access, no graph, two ids of one short name', { timeout: 60_000 }, async () => {
    hfEnvironment();
    const start = (models: string[]) => createEngine({ device: 'cpu', models, log: () => {} });
    await expect(start(['acme/nothing-here'])).rejects.toThrow(/has no repository acme\/nothing-here, or it is private and no token \(set HF_TOKEN\) gives no access to it/);
    await expect(start(['acme/embed-only@v9'])).rejects.toThrow(/acme\/embed-only has no revision "v9"/);
    await expect(start(['acme/gated-embed'])).rejects.toThrow(/is gated: request access at http:\/\/127\.0\.0\.1:\d+\/acme\/gated-embed, then set HF_TOKEN .*sent: no token/);
    process.env.HF_TOKEN = OTHER_TOKEN;
    await expect(start(['acme/gated-embed'])).rejects.toThrow(/is gated: .*sent: the token from HF_TOKEN/);
    await expect(start(['acme/no-graph'])).rejects.toThrow(/has no ONNX graph .* and no checkpoint .*; it has: .*config\.json/);
    await expect(start(['acme/embed-only', 'other/embed-only'])).rejects.toThrow(/two models named "embed-only"/);
    await expect(start(['./no/such/folder'])).rejects.toThrow(/model folder .*no\/such\/folder does not exist$/);
    // Nothing half-written is left behind.
    expect(existsSync(join(process.env.HF_HUB_CACHE!, 'models--acme--nothing-here', 'snapshots'))).toBe(false);
  });

  it('a gated repository with a token that has access: the token goes to the Hub, never to the CDN', { timeout: 60_000 }, async () => {
    hfEnvironment({ HF_TOKEN: TOKEN });
    const engine = await createEngine({ device: 'cpu', models: ['acme/gated-embed'], log: () => {} });
    await engine.close();
    const hubCalls = hub.log.filter((r) => r.server === 'hub');
    const cdnCalls = hub.log.filter((r) => r.server === 'cdn');
    expect(cdnCalls.length).toBeGreaterThan(0); // the graph, from the CDN
    expect(hubCalls.every((r) => r.authorization)).toBe(true);
    expect(cdnCalls.some((r) => r.authorization)).toBe(false);
  });

  it('a transfer cut mid-file resumes where it stopped; a corrupt file is fetched again; each checked against the announced hash', { timeout: 60_000 }, async () => {
    hfEnvironment();
    const id = parseHubId('acme/embed-only')!;
    const env = () => hfEnv({ ...process.env, HF_HUB_CACHE: mkdtempSync(join(home, 'cache-')) });
    const size = readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx')).length;
    hub.cutOnce((r) => r.server === 'cdn' && r.file === 'model.onnx', Math.floor(size / 3));
    const resumed = await fetchModel(id, { env: env(), overrides: {}, log: () => {}, backoff: noBackoff });
    const cdn = hub.log.filter((r) => r.server === 'cdn');
    // Resumed from the bytes that arrived before the cut (what the socket had delivered), not from 0.
    expect(cdn.map((r) => [r.cut ?? false, r.range === undefined])).toEqual([[true, true], [false, false]]);
    const from = Number(/^bytes=(\d+)-$/.exec(cdn[1]!.range!)?.[1]);
    expect(from).toBeGreaterThan(0);
    expect(from).toBeLessThanOrEqual(Math.floor(size / 3));
    expect(readFileSync(join(resumed.dir, 'model.onnx')).equals(readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx')))).toBe(true);

    hub.clearLog();
    hub.corruptOnce((r) => r.server === 'cdn' && r.file === 'model.onnx');
    const refetched = await fetchModel(id, { env: env(), overrides: {}, log: () => {}, backoff: noBackoff });
    expect(hub.log.filter((r) => r.server === 'cdn').length).toBe(2);
    expect(readFileSync(join(refetched.dir, 'model.onnx')).equals(readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx')))).toBe(true);
  });

  it('answers to its repository id in OpenAI requests and to its short name in URLs, over HTTP', { timeout: 120_000 }, async () => {
    hfEnvironment();
    const server = await startServer(testServerConfig({ models: ['acme/embed-only'] }));
    try {
      await server.ready; // listening comes before warm-up, which answers 503 until done
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused' });
      const byId = await client.embeddings.create({ model: 'acme/embed-only', input: 'where is my parcel' });
      const res = await fetch(`${server.url}/models/embed-only/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: 'where is my parcel' }) });
      const [row] = (await res.json()) as number[][];
      expect(maxAbsDiff(byId.data[0]!.embedding, row!)).toBeLessThan(1e-6);
      const info = (await (await fetch(`${server.url}/info`)).json()) as { models: { name: string; hub?: { commit: string } }[] };
      expect(info.models[0]).toMatchObject({ name: 'embed-only', hub: { commit: hub.revisionSha('acme/embed-only', 'main') } });
    } finally {
      await server.close();
    }
  });
});

describe('what a Hub model needs, and from where', () => {
  it('picks the configs, the tokenizer, the sentence-transformers modules and the one graph --dtype picks with its external data; the checkpoint only without a graph', () => {
    const repo = [
      'README.md', '.gitattributes', 'config.json', 'modules.json', 'sentence_bert_config.json', 'config_sentence_transformers.json',
      'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.txt', '1_Pooling/config.json', '2_Dense/config.json', '2_Dense/model.safetensors',
      '2_Dense/pytorch_model.bin', 'model.safetensors', 'pytorch_model.bin', 'onnx/model.onnx', 'onnx/model.onnx_data', 'onnx/model_fp16.onnx', 'onnx/model_fp16.onnx_data',
      'onnx/model_O4.onnx', 'onnx/model_quantized.onnx', 'openvino/openvino_model.xml', 'openvino/openvino_model.bin', 'colbert_linear.safetensors', 'colbert_linear.pt',
    ];
    const settings = ['config.json', 'modules.json', 'sentence_bert_config.json', 'config_sentence_transformers.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json', 'vocab.txt', '1_Pooling/config.json', '2_Dense/config.json', '2_Dense/model.safetensors', 'colbert_linear.safetensors'];
    const pick = (paths: string[], overrides = {}) => pickFiles(paths, 'org/x', 'x', overrides);
    expect(pick(repo)).toEqual({ files: [...settings, 'onnx/model.onnx', 'onnx/model.onnx_data'], graph: 'onnx/model.onnx' });
    expect(pick(repo, { onCuda: true }).graph).toBe('onnx/model_fp16.onnx');
    expect(pick(repo, { dtype: 'int8' }).files.slice(settings.length)).toEqual(['onnx/model_quantized.onnx']);
    expect(() => pick(repo.filter((p) => !p.includes('fp16')), { dtype: 'fp16' })).toThrow(/--dtype fp16 but org\/x has no model_fp16\.onnx .*it has: fp32, int8/);
    const noGraph = repo.filter((p) => !p.startsWith('onnx/'));
    expect(pick(noGraph).files.slice(settings.length)).toEqual(['model.safetensors']);
    expect(pick(['config.json', 'model.safetensors.index.json', 'model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors', 'pytorch_model.bin']).files).toEqual(['config.json', 'model.safetensors.index.json', 'model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors']);
    expect(() => pick(['README.md', 'model.onnx'])).toThrow(/org\/x has no config\.json/);
    // --weights checkpoint: the checkpoint even beside a graph; --weights graph: never the checkpoint.
    expect(pick(repo, { weights: 'checkpoint' }).files.slice(settings.length)).toEqual(['model.safetensors']);
    expect(() => pick(noGraph, { weights: 'graph' })).toThrow(/has no ONNX graph/);
  });

  it('refuses a file the disk cannot hold before fetching a byte of it, and leaves nothing behind', async () => {
    const cache = new RepoCache(mkdtempSync(join(home, 'cache-')), 'acme/huge');
    mkdirSync(join(cache.folder, 'blobs'), { recursive: true });
    const { bavail, bsize } = statfsSync(join(cache.folder, 'blobs'));
    const file = { path: 'model.onnx', size: bavail * bsize + 2 ** 30, etag: 'a'.repeat(64), lfs: true };
    let opened = 0;
    const open = async () => {
      opened++;
      throw new Error('not to be opened');
    };
    await expect(downloadFile(cache, 'c'.repeat(40), file, { open })).rejects.toThrow(/not enough disk space for .*: \d+ bytes needed, \d+ free/);
    expect(opened).toBe(0);
    expect(readdirSync(join(cache.folder, 'blobs'))).toEqual([]);
    expect(existsSync(cache.snapshotDir('c'.repeat(40)))).toBe(false);
  });

  it('shows a download as a bar redrawn in place on a terminal, and as a line per file elsewhere', () => {
    for (const isTTY of [true, false]) {
      const written: string[] = [];
      const lines: string[] = [];
      const out = { isTTY, write: (s: string) => written.push(s) } as unknown as NodeJS.WriteStream;
      const p = downloadProgress('acme/x', (l) => lines.push(l), out);
      p.start('model.onnx', 4 * 2 ** 20, 2 ** 20);
      p.update('model.onnx', 2 * 2 ** 20);
      p.done('model.onnx', 4 * 2 ** 20);
      expect(lines).toEqual([expect.stringMatching(/^slabserve: acme\/x: resuming model\.onnx at 1\.0 MB of 4\.0 MB$/), expect.stringMatching(/^slabserve: acme\/x: fetched model\.onnx \(3\.0 MB\) in \d+\.\d s$/)]);
      if (isTTY) expect(written[0]).toMatch(/^\racme\/x model\.onnx \[#{12}\.{12}\] 50% 2\.0 MB\/4\.0 MB/);
      else expect(written).toEqual([]);
    }
  });

  it('reads the token from the token file when HF_TOKEN is not set, and retries the Hub\'s 5xx answers', { timeout: 60_000 }, async () => {
    hfEnvironment();
    mkdirSync(process.env.HF_HOME!, { recursive: true });
    writeFileSync(join(process.env.HF_HOME!, 'token'), `${TOKEN}\n`);
    const env = hfEnv();
    expect(env).toMatchObject({ token: TOKEN, tokenSource: join(process.env.HF_HOME!, 'token') });
    hub.failNext((r) => r.kind === 'model-info', 2, 503);
    const fetched = await fetchModel({ repo: 'acme/gated-embed', revision: 'main' }, { env, overrides: {}, log: () => {}, backoff: noBackoff });
    expect(fetched.online).toBe(true);
    expect(hub.log.filter((r) => r.kind === 'model-info').map((r) => r.status)).toEqual([503, 503, 200]);
  });

  it('loads a model by its Hub id while serving, through the repository API (the id percent-encoded)', { timeout: 120_000 }, async () => {
    hfEnvironment();
    const server = await startServer(testServerConfig({ models: ['tiny-embed'], modelControlMode: 'explicit' }));
    try {
      await server.ready;
      const load = await fetch(`${server.url}/v2/repository/models/${encodeURIComponent('acme/tiny-embed@v1')}/load`, { method: 'POST' });
      expect(load.status, await load.clone().text()).toBe(200);
      const res = await fetch(`${server.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'acme/tiny-embed', input: 'where is my parcel' }) });
      expect(res.status).toBe(200);
      const missing = await fetch(`${server.url}/v2/repository/models/${encodeURIComponent('acme/nothing-here')}/load`, { method: 'POST' });
      expect(missing.status).toBe(400);
      expect(await missing.text()).toMatch(/has no repository acme\/nothing-here/);
    } finally {
      await server.close();
    }
  });
});

describe('a Hub model in a cluster', () => {
  it('loaded while serving, reaches every process; a process restarted later serves it again from the cache, at the commit the others serve', { timeout: 180_000 }, async () => {
    hfEnvironment();
    const server = await serveCli(['--processes', '2', '--gateway-threads', '1', '--model-control-mode', 'explicit']);
    try {
      const id = encodeURIComponent('acme/tiny-embed@v1');
      const load = await fetch(`http://127.0.0.1:${server.port}/v2/repository/models/${id}/load`, { method: 'POST' });
      expect(load.status, await load.clone().text()).toBe(200);
      const embedStatuses = () =>
        Promise.all(
          Array.from({ length: 16 }, () =>
            fetch(`http://127.0.0.1:${server.port}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json', connection: 'close' }, body: JSON.stringify({ model: 'acme/tiny-embed', input: 'where is my parcel' }) }).then((r) => r.status),
          ),
        );
      expect(await embedStatuses()).toEqual(Array(16).fill(200));
      hub.clearLog();
      const pid = Number(/process 0 \(cpu\) started, pid (\d+)/.exec(server.stderr())?.[1]);
      process.kill(pid, 'SIGKILL');
      await eventually('process 0 ready again', async () => server.stderr(), (s) => /process 0 \(pid \d+\) ready again/.test(s), 90_000, (s) => s.slice(-1500));
      expect(await embedStatuses()).toEqual(Array(16).fill(200));
      expect(hub.log).toEqual([]); // the commit served, from the cache
    } finally {
      server.kill('SIGTERM');
      await server.exited;
    }
  });
});

describe('slabserve download', () => {
  const cli = (args: string[], env: NodeJS.ProcessEnv) => run(process.execPath, [CLI, 'download', ...args], { env, timeout: 60_000 });

  it('fetches into the cache for a later offline start, or as plain folders with --models-dir', { timeout: 120_000 }, async () => {
    const cache = hfEnvironment();
    const { stderr } = await cli(['acme/embed-only', 'acme/tiny-embed@v1'], process.env);
    expect(stderr).toMatch(/acme\/embed-only: fetched model\.onnx/);
    expect(filesAsked(hub.log)).toEqual(NEEDED);
    expect(readdirSync(cache).sort()).toEqual(['.locks', 'models--acme--embed-only', 'models--acme--tiny-embed']);
    Object.assign(process.env, { HF_HUB_OFFLINE: '1' });
    const engine = await createEngine({ device: 'cpu', models: ['acme/tiny-embed@v1'], log: () => {} });
    expect(engine.info()[0]).toMatchObject({ task: 'embed', hub: { commit: hub.revisionSha('acme/tiny-embed', 'v1') } });
    await engine.close();

    const dir = mkdtempSync(join(home, 'plain-'));
    await cli(['acme/embed-only', '--models-dir', dir], { ...process.env, HF_HUB_OFFLINE: undefined });
    expect(readdirSync(dir)).toEqual(['embed-only']);
    for (const file of NEEDED) {
      expect(lstatSync(join(dir, 'embed-only', file)).isFile()).toBe(true);
      expect(readFileSync(join(dir, 'embed-only', file)).equals(readFileSync(join(modelsDir, 'tiny-embed', file)))).toBe(true);
    }
    await expect(cli(['not-an-id'], process.env)).rejects.toMatchObject({ stderr: expect.stringMatching(/"not-an-id" is no Hub id: ORG\/NAME/) });
  });

  it('a download killed mid-file is resumed by the next one, from the bytes it left', { timeout: 120_000 }, async () => {
    const cache = hfEnvironment();
    const size = readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx')).length;
    const held = hub.hold((r) => r.server === 'cdn' && r.file === 'model.onnx', { afterBytes: Math.floor(size / 2) });
    const child = spawn(process.execPath, [CLI, 'download', 'acme/embed-only'], { env: process.env, stdio: 'ignore' });
    await held.arrived;
    const partial = join(cache, 'models--acme--embed-only', 'blobs', createHash('sha256').update(readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx'))).digest('hex') + '.incomplete');
    // Killed once what it was sent has reached the file (the fake holds the rest).
    await whenFileSize(partial, (n) => n >= Math.floor(size / 2), 'the first half of the graph written');
    child.kill('SIGKILL');
    await new Promise((r) => child.once('exit', r));
    held.release();
    hub.clearLog();
    // Its lock is left behind; the next download takes it over once it is stale, then resumes.
    await cli(['acme/embed-only'], process.env);
    const cdn = hub.log.filter((r) => r.server === 'cdn' && r.file === 'model.onnx');
    expect(cdn.map((r) => r.range)).toEqual([`bytes=${Math.floor(size / 2)}-`]);
    const snapshot = join(cache, 'models--acme--embed-only', 'snapshots', hub.revisionSha('acme/embed-only', 'main'));
    expect(readFileSync(join(snapshot, 'model.onnx')).equals(readFileSync(join(modelsDir, 'tiny-embed', 'model.onnx')))).toBe(true);
  });

  it('two processes fetching one model at once download each file once', { timeout: 120_000 }, async () => {
    const cache = hfEnvironment();
    const held = hub.hold((r) => r.server === 'cdn' && r.file === 'model.onnx', { afterBytes: 1000 });
    const spawnOne = () =>
      new Promise<{ code: number | null; stderr: string }>((resolve) => {
        const child = spawn(process.execPath, [CLI, 'download', 'acme/embed-only'], { env: process.env });
        let stderr = '';
        child.stderr.on('data', (d) => (stderr += d));
        child.on('exit', (code) => resolve({ code, stderr }));
      });
    const first = spawnOne();
    await held.arrived; // the first is inside the graph's download, holding its lock
    // The next listing is the second's: held as it arrives, so the first is released only once the
    // second has come as far as listing the repository (then it waits on the graph's lock).
    const secondListing = hub.hold((r) => r.kind === 'tree');
    const second = spawnOne();
    await secondListing.arrived;
    secondListing.release();
    held.release();
    const results = await Promise.all([first, second]);
    expect(results.map((r) => r.code), results.map((r) => r.stderr).join('\n')).toEqual([0, 0]);
    expect(hub.log.filter((r) => r.server === 'cdn' && r.file === 'model.onnx').length).toBe(1);
    expect(existsSync(join(cache, 'models--acme--embed-only', 'refs', 'main'))).toBe(true);
  });
});
