/**
 * OpenAI's token ids on /v1/embeddings: integer inputs are tiktoken's cl100k_base ids, as
 * LangChain Python's `OpenAIEmbeddings` sends them by default (each text tokenized with
 * tiktoken, `allowed_special=set()` and `disallowed_special="all"`, cut into pieces of
 * `embedding_ctx_length` ids, the pieces sent as a list of id lists). The ids are made here by
 * `js-tiktoken` and sent through the official `openai` client, unchanged: each answer must be the
 * answer for the text the ids spell (to 1e-6), and the unmodified graph's embedding of that text
 * alone (plain onnxruntime, pooled by this test). `"token_encoding": "model"` takes the model's
 * own ids instead. On a real server (port 0, CPU).
 */
import { getEncoding, type Tiktoken } from 'js-tiktoken';
import OpenAI, { BadRequestError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { makeRandom, maxAbsDiff, PlainReference, randomTexts, testServerConfig, vocabularyWords } from './helpers.js';

const TOLERANCE = 1e-5;
const SAME = 1e-6;

let server: Server;
let openai: OpenAI;
let ref: PlainReference;
let tok: TextTokenizer;
let words: string[];
let cl100k: Tiktoken;

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-embed'], batching: { buckets: [8, 16, 32, 64, 128] } }));
  await server.ready;
  openai = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
  ref = await PlainReference.open('tiny-embed');
  tok = await loadTokenizer(ref.spec.tokenizerPath);
  words = vocabularyWords(ref.spec);
  cl100k = getEncoding('cl100k_base');
}, 120_000);

afterAll(async () => {
  await ref?.close();
  await server?.close();
});

/** LangChain Python's OpenAIEmbeddings._tokenize: tiktoken ids of each text, cut into pieces of `ctx` ids. */
function langchainTokens(texts: string[], ctx = 8191): { tokens: number[][]; indices: number[] } {
  const tokens: number[][] = [];
  const indices: number[] = [];
  texts.forEach((text, i) => {
    const ids = cl100k.encode(text, [], 'all');
    for (let j = 0; j < ids.length; j += ctx) {
      tokens.push(ids.slice(j, j + ctx));
      indices.push(i);
    }
  });
  return { tokens, indices };
}

/** The unmodified graph's embedding of `text` alone, mean-pooled and normalised here. */
const reference = (text: string) => ref.embedding(tok.encode(text, { maxLength: 128, truncate: false }).ids);

/** Texts of the model's words with capitals, accents, punctuation, emoji and CJK between them. */
function messy(rand: () => number, count: number): string[] {
  const extras = ['Où', 'naïve', '😀', '你好', '—', '¿qué?', 'ÉTÉ', '42', '\n'];
  return randomTexts(rand, words, count, 14).map((t) =>
    t
      .split(' ')
      .map((w) => (rand() < 0.3 ? `${extras[Math.floor(rand() * extras.length)]} ${w}` : rand() < 0.2 ? w[0]!.toUpperCase() + w.slice(1) : w))
      .join(' '),
  );
}

describe("cl100k_base token ids on /v1/embeddings (LangChain Python's default)", () => {
  it("lists of cl100k ids made by js-tiktoken, sent through the openai client: each the text's own answer and the graph's embedding of that text", async () => {
    const texts = messy(makeRandom('cl100k lists'), 6);
    const { tokens } = langchainTokens(texts);
    expect(tokens).toHaveLength(texts.length); // short texts: one piece each
    // The ids really are cl100k's, not the model's (the two vocabularies differ on every one of these texts).
    for (const [i, ids] of tokens.entries()) expect(ids).not.toEqual(Array.from(tok.encode(texts[i]!, { maxLength: 128, truncate: false }).ids));

    const byIds = await openai.embeddings.create({ model: 'tiny-embed', input: tokens }); // base64, decoded by the client, as openai-python does
    const byText = await openai.embeddings.create({ model: 'tiny-embed', input: texts });
    expect(byIds.data.map((d) => d.index)).toEqual(texts.map((_, i) => i));
    for (const [i, text] of texts.entries()) {
      expect(maxAbsDiff(byIds.data[i]!.embedding, byText.data[i]!.embedding), text).toBeLessThan(SAME);
      expect(maxAbsDiff(byIds.data[i]!.embedding, await reference(text)), text).toBeLessThan(TOLERANCE);
    }
    // usage counts the model's tokens of the decoded texts, as for the texts
    expect(byIds.usage).toEqual(byText.usage);

    // one list of ids is one input; floats too
    const one = await openai.embeddings.create({ model: 'tiny-embed', input: tokens[0]!, encoding_format: 'float' });
    expect(one.data).toHaveLength(1);
    expect(maxAbsDiff(one.data[0]!.embedding, byText.data[0]!.embedding)).toBeLessThan(SAME);
  });

  it('a text cut into pieces of a few ids (embedding_ctx_length), mixed with plain strings: each piece is the text it decodes to', async () => {
    // (words of the model's vocabulary: a piece boundary inside a multi-byte character would decode to U+FFFD on either side)
    const [long] = randomTexts(makeRandom('cl100k pieces'), words, 1, 14).map((t) => `${t}, ${t.toUpperCase()}!`);
    const { tokens, indices } = langchainTokens([long!], 5);
    expect(tokens.length).toBeGreaterThan(1);
    expect(indices.every((i) => i === 0)).toBe(true);
    const input = [...tokens, 'where is my parcel'];
    const r = await openai.embeddings.create({ model: 'tiny-embed', input, encoding_format: 'float' });
    expect(r.data).toHaveLength(input.length);
    const pieces = [...tokens.map((ids) => cl100k.decode(ids)), 'where is my parcel'];
    expect(pieces.slice(0, -1).join('')).toBe(long); // the pieces spell the text
    for (const [i, piece] of pieces.entries()) {
      expect(maxAbsDiff(r.data[i]!.embedding, await reference(piece)), JSON.stringify(piece)).toBeLessThan(TOLERANCE);
    }
    const asText = await openai.embeddings.create({ model: 'tiny-embed', input: pieces, encoding_format: 'float' });
    asText.data.forEach((d, i) => expect(maxAbsDiff(r.data[i]!.embedding, d.embedding), JSON.stringify(pieces[i])).toBeLessThan(SAME));
  });

  it('"token_encoding": "model" takes the same integers as the model\'s own ids; an id outside cl100k_base or an unknown encoding is a 400', async () => {
    const [text] = randomTexts(makeRandom('cl100k switch'), words, 1, 12);
    const own = Array.from(tok.encode(text!, { maxLength: 128, truncate: false }).ids);
    const asModel = await openai.embeddings.create({ model: 'tiny-embed', input: own, encoding_format: 'float', token_encoding: 'model' } as never);
    expect(maxAbsDiff((asModel as OpenAI.CreateEmbeddingResponse).data[0]!.embedding, await reference(text!))).toBeLessThan(TOLERANCE);
    // the same integers read as cl100k_base ids are another text
    const asCl100k = await openai.embeddings.create({ model: 'tiny-embed', input: own, encoding_format: 'float' });
    expect(maxAbsDiff(asCl100k.data[0]!.embedding, await reference(cl100k.decode(own)))).toBeLessThan(TOLERANCE);
    expect(maxAbsDiff(asCl100k.data[0]!.embedding, await reference(text!))).toBeGreaterThan(1e-3);

    for (const body of [
      { model: 'tiny-embed', input: [[15339, 100_256]] },
      { model: 'tiny-embed', input: [15339, 200_000] },
      { model: 'tiny-embed', input: 'hi', token_encoding: 'p50k_base' },
    ]) {
      const err = await openai.embeddings.create(body as never).catch((e: unknown) => e);
      expect(err, JSON.stringify(body)).toBeInstanceOf(BadRequestError);
      expect((err as BadRequestError).param).toBe((body as { token_encoding?: string }).token_encoding ? 'token_encoding' : 'input');
    }
  });

  it("--openai-token-ids model makes the model's own ids the default; a request's token_encoding still decides", async () => {
    const own = await startServer(testServerConfig({ models: ['tiny-embed'], openaiTokenIds: 'model', batching: { buckets: [8, 16, 32, 64, 128] } }));
    try {
      await own.ready;
      const client = new OpenAI({ baseURL: own.url + '/v1', apiKey: 'unused', maxRetries: 0 });
      const [text] = randomTexts(makeRandom('cl100k server switch'), words, 1, 12);
      const ids = Array.from(tok.encode(text!, { maxLength: 128, truncate: false }).ids);
      const asModel = await client.embeddings.create({ model: 'tiny-embed', input: ids, encoding_format: 'float' });
      expect(maxAbsDiff(asModel.data[0]!.embedding, await reference(text!))).toBeLessThan(TOLERANCE);
      const cl = cl100k.encode(text!, [], 'all');
      const asCl100k = await client.embeddings.create({ model: 'tiny-embed', input: cl, encoding_format: 'float', token_encoding: 'cl100k_base' } as never);
      expect(maxAbsDiff((asCl100k as OpenAI.CreateEmbeddingResponse).data[0]!.embedding, await reference(text!))).toBeLessThan(TOLERANCE);
    } finally {
      await own.close();
    }
  });
});
