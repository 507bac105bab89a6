/**
 * Cohere's Embed v2 (POST /v2/embed) on a real server (port 0, CPU), through cohere-ai's
 * CohereClientV2 unchanged. Float rows are checked against the reference (a plain onnxruntime
 * session of the unmodified tiny-embed graph on each text alone, mean-pooled and normalised here),
 * with the prompt the `input_type` implies: a copy of tiny-embed with sentence-transformers
 * prompts named query and document takes "query: " for search_query and "document: " for
 * search_document, and nothing for classification and clustering, which it has no prompt for.
 * The quantized types are checked against their rules (docs/http-api.md, Quantized embeddings)
 * applied here to the same request's float row, and base64 against its float32 bytes.
 */
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CohereClientV2 } from 'cohere-ai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { makeRandom, maxAbsDiff, modelsDir, PlainReference, randomTexts, testServerConfig, vocabularyWords } from './helpers.js';

const TOLERANCE = 1e-5;
const MAX = 128;
const PROMPTS = { query: 'query: ', document: 'document: ' };

let server: Server;
let root: string;
let ref: PlainReference;
let tok: TextTokenizer;
let words: string[];
let cohere: CohereClientV2;

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'slabserve-cohere-'));
  const dir = join(root, 'tiny-prompted');
  cpSync(join(modelsDir, 'tiny-embed'), dir, { recursive: true });
  writeFileSync(join(dir, 'config_sentence_transformers.json'), JSON.stringify({ prompts: PROMPTS }));
  server = await startServer(testServerConfig({ models: ['tiny-embed', dir, 'tiny-rerank'], batching: { buckets: [8, 16, 32, 64, MAX] } }));
  await server.ready;
  ref = await PlainReference.open('tiny-embed');
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  words = vocabularyWords(ref.spec);
  cohere = new CohereClientV2({ token: 'unused', environment: server.url });
}, 120_000);

afterAll(async () => {
  await ref?.close();
  await server?.close();
  if (root) rmSync(root, { recursive: true, force: true });
});

/** The unmodified graph's embedding of `text` alone (cut as asked). */
const reference = (text: string, truncate = false, direction: 'left' | 'right' = 'right') => ref.embedding(tok.encode(text, { maxLength: MAX, truncate, direction }).ids);

// ------------------------------------------------------------ the quantization rules, written here

/** Round half away from zero. */
const round = (x: number) => Math.sign(x) * Math.round(Math.abs(x)) || 0; // no -0: JSON has none
function unit(v: ArrayLike<number>): number[] {
  const norm = Math.sqrt(Array.from(v).reduce((s, x) => s + x * x, 0));
  return Array.from(v, (x) => (norm > 0 && Number.isFinite(norm) ? x / norm : 0));
}
const int8 = (v: ArrayLike<number>) => unit(v).map((x) => Math.min(127, Math.max(-127, round(127 * x))));
const uint8 = (v: ArrayLike<number>) => unit(v).map((x) => Math.min(255, Math.max(0, round(127.5 * (x + 1)))));
function ubinary(v: ArrayLike<number>): number[] {
  const out = new Array(Math.ceil(v.length / 8)).fill(0);
  for (let i = 0; i < v.length; i++) if (v[i]! > 0) out[i >> 3] |= 0x80 >> (i & 7);
  return out;
}
const binary = (v: ArrayLike<number>) => ubinary(v).map((b) => b - 128);
function float32Bytes(v: ArrayLike<number>): string {
  const b = Buffer.alloc(v.length * 4);
  for (let i = 0; i < v.length; i++) b.writeFloatLE(v[i]!, i * 4);
  return b.toString('base64');
}

async function post(body: unknown): Promise<{ status: number; body: any }> {
  const r = await fetch(server.url + '/v2/embed', { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { status: r.status, body: JSON.parse(await r.text()) };
}

describe('Cohere Embed v2 (cohere-ai CohereClientV2.embed)', () => {
  it('every embedding type from one pass: float the reference row with the prompt input_type implies, the others its quantizations and bytes', async () => {
    const rand = makeRandom('cohere embed types');
    const texts = randomTexts(rand, words, 4, 20);
    const r = await cohere.embed({ model: 'tiny-prompted', texts, inputType: 'search_query', embeddingTypes: ['float', 'int8', 'uint8', 'binary', 'ubinary', 'base64'] });
    expect(typeof r.id).toBe('string');
    expect(r.texts).toEqual(texts);
    const floats = r.embeddings.float!;
    expect(floats).toHaveLength(texts.length);
    for (const [i, text] of texts.entries()) {
      expect(maxAbsDiff(floats[i]!, await reference(PROMPTS.query + text)), text).toBeLessThan(TOLERANCE);
      expect(maxAbsDiff(floats[i]!, await reference(text)), 'the prompt changes the row').toBeGreaterThan(1e-3);
      expect(r.embeddings.int8![i]).toEqual(int8(floats[i]!));
      expect(r.embeddings.uint8![i]).toEqual(uint8(floats[i]!));
      expect(r.embeddings.ubinary![i]).toEqual(ubinary(floats[i]!));
      expect(r.embeddings.binary![i]).toEqual(binary(floats[i]!));
      expect(r.embeddings.base64![i]).toBe(float32Bytes(floats[i]!));
    }
    const tokens = texts.reduce((n, t) => n + tok.encode(PROMPTS.query + t, { maxLength: MAX, truncate: false }).ids.length, 0);
    expect(r.meta?.billedUnits?.inputTokens).toBe(tokens);
    expect(r.meta?.apiVersion?.version).toBe('2');
  });

  it("input_type picks the model's prompt named query or document; classification, clustering and a model without prompts embed the text as it is", async () => {
    const rand = makeRandom('cohere embed input types');
    const texts = randomTexts(rand, words, 2, 16);
    const want = async (prefix: string) => Promise.all(texts.map((t) => reference(prefix + t)));
    const cases: [string, 'search_query' | 'search_document' | 'classification' | 'clustering', string][] = [
      ['tiny-prompted', 'search_document', PROMPTS.document],
      ['tiny-prompted', 'classification', ''],
      ['tiny-prompted', 'clustering', ''],
      ['tiny-embed', 'search_query', ''],
      ['tiny-embed', 'search_document', ''],
    ];
    for (const [model, inputType, prefix] of cases) {
      const r = await cohere.embed({ model, texts, inputType, embeddingTypes: ['float'] });
      const expected = await want(prefix);
      r.embeddings.float!.forEach((row, i) => expect(maxAbsDiff(row, expected[i]!), `${model} ${inputType}`).toBeLessThan(TOLERANCE));
      expect(r.embeddings.int8, 'only the types asked for').toBeUndefined();
    }
    // no embedding_types: float
    const plain = await post({ model: 'tiny-embed', texts, input_type: 'clustering' });
    expect(Object.keys(plain.body.embeddings)).toEqual(['float']);
  });

  it('output_dimension keeps the first N components, normalised again; truncate END (the default) and START cut a long text, NONE refuses it', async () => {
    const rand = makeRandom('cohere embed cut');
    const [text] = randomTexts(rand, words, 1, 20);
    const full = await reference(text!);
    const short = await cohere.embed({ model: 'tiny-embed', texts: [text!], inputType: 'search_document', embeddingTypes: ['float', 'int8'], outputDimension: 16 });
    const head = full.slice(0, 16);
    const norm = Math.hypot(...head);
    expect(maxAbsDiff(short.embeddings.float![0]!, head.map((x) => x / norm))).toBeLessThan(TOLERANCE);
    expect(short.embeddings.int8![0]).toEqual(int8(short.embeddings.float![0]!));

    const long = Array.from({ length: 200 }, () => words[Math.floor(rand() * words.length)]).join(' ');
    const end = await cohere.embed({ model: 'tiny-embed', texts: [long], inputType: 'search_document', embeddingTypes: ['float'] });
    expect(maxAbsDiff(end.embeddings.float![0]!, await reference(long, true, 'right'))).toBeLessThan(TOLERANCE);
    const start = await cohere.embed({ model: 'tiny-embed', texts: [long], inputType: 'search_document', embeddingTypes: ['float'], truncate: 'START' });
    expect(maxAbsDiff(start.embeddings.float![0]!, await reference(long, true, 'left'))).toBeLessThan(TOLERANCE);
    const none = await post({ model: 'tiny-embed', texts: [long], input_type: 'search_document', truncate: 'NONE' });
    expect(none.status).toBe(400);
    expect(none.body).toMatchObject({ message: expect.stringMatching(/"truncate": "END"/), code: 'SLABSERVE_INPUT_TOO_LONG' });
    // max_tokens: at most that many tokens an input (cut at its end by default)
    const capped = await post({ model: 'tiny-embed', texts: [long], input_type: 'search_document', max_tokens: 20 });
    expect(maxAbsDiff(capped.body.embeddings.float[0], await ref.embedding(tok.encode(long, { maxLength: 20, truncate: true }).ids))).toBeLessThan(TOLERANCE);
  });

  it("bad input is a 400 (unknown model 404) in Cohere's shape: unknown input_type or embedding type, missing or empty texts, output_dimension too large, a reranker", async () => {
    const good = { model: 'tiny-embed', texts: ['hi'], input_type: 'search_query' };
    const cases: [unknown, number][] = [
      [{ ...good, input_type: 'search' }, 400],
      [{ ...good, input_type: 'image' }, 400],
      [{ model: 'tiny-embed', texts: ['hi'] }, 400],
      [{ ...good, embedding_types: ['float16'] }, 400],
      [{ ...good, embedding_types: [] }, 400],
      [{ ...good, texts: undefined }, 400],
      [{ ...good, texts: [] }, 400],
      [{ ...good, texts: [''] }, 400],
      [{ ...good, output_dimension: 129 }, 400],
      [{ ...good, truncate: 'MIDDLE' }, 400],
      [{ ...good, images: ['data:image/png;base64,AAAA'] }, 400],
      [{ ...good, model: 'tiny-rerank' }, 400],
      [{ ...good, model: 'nope' }, 404],
    ];
    for (const [body, status] of cases) {
      const r = await post(body);
      expect(r.status, JSON.stringify(body)).toBe(status);
      expect(r.body, JSON.stringify(body)).toEqual({ id: expect.any(String), message: expect.any(String), code: expect.stringMatching(/^SLABSERVE_/) });
    }
  });
});
