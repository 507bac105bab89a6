/**
 * What a new user hit with request bodies (issue 22, items 3, 4, 7, 8), on
 * real servers (port 0, real sockets, real onnxruntime on CPU) and the
 * official clients:
 *
 * - a misspelled field is refused, naming it and the nearest known one, on
 *   every route and the WebSocket ops (OpenAI's route in OpenAI's words, its
 *   own fields accepted);
 * - the advice of every "input too long" answer works: following it, the
 *   same request succeeds, with the row of the cut input (checked against
 *   the unmodified graph run alone); `truncate` on OpenAI's route, and
 *   `--truncate` as the server's default;
 * - `@huggingface/inference`'s textClassification reads our /predict and
 *   root answers, while TEI's shape stays for TEI's own clients;
 * - POST / picks the model by the body's shape when none is named.
 */
import { InferenceClient } from '@huggingface/inference';
import OpenAI, { BadRequestError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer, type TextTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { startServer, type Server } from '../dist/src/main/server.js';
import { makeRandom, maxAbsDiff, PlainReference, randomTexts, testServerConfig, vocabularyWords, wsRequest } from './helpers.js';

const TOLERANCE = 1e-5;
const BUCKETS = [8, 16, 32, 64, 128];
const MAX_LENGTH = 128; // the longest bucket: the served max length

/** The order: the first model an embedder. */
let server: Server;
/** The same models, reranker first; and --truncate on. */
let rerankFirst: Server;
let embedRef: PlainReference;
let intentRef: PlainReference;
let tok: TextTokenizer;
let words: string[];

beforeAll(async () => {
  server = await startServer(testServerConfig({ models: ['tiny-embed', 'tiny-intent', 'tiny-rerank'], batching: { buckets: BUCKETS } }));
  rerankFirst = await startServer(testServerConfig({ models: ['tiny-rerank', 'tiny-intent', 'tiny-embed'], batching: { buckets: BUCKETS }, truncate: true }));
  await Promise.all([server.ready, rerankFirst.ready]);
  [embedRef, intentRef] = await Promise.all([PlainReference.open('tiny-embed'), PlainReference.open('tiny-intent')]);
  tok = await loadTokenizer(embedRef.spec.tokenizerPath);
  words = vocabularyWords(embedRef.spec);
}, 120_000);

afterAll(async () => {
  await Promise.all([embedRef?.close(), intentRef?.close()]);
  await Promise.all([server?.close(), rerankFirst?.close()]);
});

async function post(srv: Server, path: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; body: any }> {
  const r = await fetch(srv.url + path, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  const text = await r.text();
  try {
    return { status: r.status, body: JSON.parse(text) };
  } catch {
    return { status: r.status, body: text };
  }
}

/** The error message of any of our shapes: ours and KServe's `{error: string}`, OpenAI's `{error: {message}}`. */
const messageOf = (body: any): string => (typeof body?.error === 'string' ? body.error : String(body?.error?.message));

async function slotsInUse(srv: Server): Promise<number> {
  const text = await (await fetch(srv.url + '/metrics')).text();
  return text
    .split('\n')
    .filter((l) => l.startsWith('slabserve_slots_in_use{'))
    .reduce((n, l) => n + Number(l.split(' ').pop()), 0);
}

// ------------------------------------------------------------ unknown fields

describe('a field the body does not take', () => {
  const kserveText = { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: ['hi'] }] };
  const cases: { path: string; body: Record<string, unknown>; field: string; near: string | null; status?: number }[] = [
    { path: '/embed', body: { inputs: 'hi', normalise: true }, field: 'normalise', near: 'normalize' },
    { path: '/embed', body: { inputs: ['a', 'b'], trunctate: true }, field: 'trunctate', near: 'truncate' },
    { path: '/predict', body: { inputs: 'hi', raw_score: true }, field: 'raw_score', near: 'raw_scores' },
    { path: '/rerank', body: { query: 'q', texts: ['a'], return_texts: true }, field: 'return_texts', near: 'return_text' },
    { path: '/similarity', body: { inputs: { source_sentence: 'a', sentences: ['b'] }, parameters: { truncat: true } }, field: 'parameters.truncat', near: 'truncate' },
    { path: '/tokenize', body: { inputs: 'hi', add_special_token: false }, field: 'add_special_token', near: 'add_special_tokens' },
    { path: '/decode', body: { ids: [101, 102], skip_special: true }, field: 'skip_special', near: null },
    { path: '/', body: { inputs: 'hi', modle: 'tiny-embed' }, field: 'modle', near: 'model' },
    { path: '/v2/models/tiny-embed/infer', body: { ...kserveText, output: [{ name: 'embedding' }] }, field: 'output', near: 'outputs' },
    { path: '/v1/embeddings', body: { input: 'hi', model: 'tiny-embed', encodingformat: 'float' }, field: 'encodingformat', near: 'encoding_format', status: 400 },
  ];

  it('is refused with 422 (OpenAI: 400) naming the field and the nearest known one, on every route; no slot is left', async () => {
    for (const { path, body, field, near, status } of cases) {
      const r = await post(server, path, body);
      expect(r.status, `${path} ${JSON.stringify(body)}`).toBe(status ?? 422);
      const message = messageOf(r.body);
      expect(message, path).toContain(field);
      if (near !== null) expect(message, path).toContain(`did you mean "${near}"?`);
    }
    // Without the misspelling each body is served: the refusal was the field's, nothing else's.
    const fixed = (await Promise.all(cases.map(({ path, body, field, near }) => post(server, path, renamed(body, field, near))))).map((r) => r.status);
    expect(fixed).toEqual(cases.map(() => 200));
    expect(await slotsInUse(server)).toBe(0);
  });

  it('OpenAI route: OpenAI\'s words and param; its own fields through the official client are accepted', async () => {
    const openai = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
    const ok = await openai.embeddings.create({ model: 'tiny-embed', input: ['hi', 'there'], encoding_format: 'float', dimensions: 64, user: 'user-1' });
    expect(ok.data.map((d) => d.embedding.length)).toEqual([64, 64]);
    const err = await openai.embeddings.create({ model: 'tiny-embed', input: 'hi', normalise: true } as never).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BadRequestError);
    const e = err as BadRequestError;
    expect((e.error as { message: string }).message).toMatch(/^Unrecognized request argument supplied: normalise/);
    expect((e.error as { type: string }).type).toBe('invalid_request_error');
    expect((e.error as { param: string }).param).toBe('normalise');
  });

  it('msgpack bodies and WebSocket ops are held to the same fields; a frame\'s own fields are not the body\'s', async () => {
    const { pack, unpack } = await import('msgpackr');
    const r = await fetch(server.url + '/embed', { method: 'POST', headers: { 'content-type': 'application/msgpack', accept: 'application/msgpack' }, body: pack({ inputs: 'hi', normalise: true }) });
    expect(r.status).toBe(422);
    expect((unpack(Buffer.from(await r.arrayBuffer())) as { error: string }).error).toContain('did you mean "normalize"?');
    const refused = await wsRequest(server.port, { id: 1, op: 'embed', inputs: 'hi', normalise: true });
    expect(refused.id).toBe(1);
    expect(refused.error.code).toBe('SLABSERVE_INVALID_INPUT');
    expect(refused.error.message).toContain('did you mean "normalize"?');
    // id, op, deadline_ms and encoding belong to the frame: accepted with the body's fields.
    const served = await wsRequest(server.port, { id: 2, op: 'embed', inputs: 'hi', normalize: true, deadline_ms: 5000, encoding: 'f32', priority: 'bulk' });
    expect(served.error, JSON.stringify(served)).toBeUndefined();
    expect(served.id).toBe(2);
  });
});

/** `body` with `field` named `to` instead (or dropped when `to` is null). */
function renamed(body: Record<string, unknown>, field: string, to: string | null): Record<string, unknown> {
  const [head, ...rest] = field.split('.');
  if (rest.length > 0) return { ...body, [head!]: renamed(body[head!] as Record<string, unknown>, rest.join('.'), to) };
  const { [head!]: value, ...others } = body;
  return to === null ? others : { ...others, [to]: value };
}

// ------------------------------------------------------------ too long: advice that works

describe('an input too long', () => {
  const long = (rand: () => number) => randomTexts(rand, words, 1, 400)[0]! + ' ' + 'parcel '.repeat(200);

  it('every route\'s advice, followed, gives the row of the cut input', async () => {
    const rand = makeRandom('too long');
    const text = long(rand);
    const kserve = (t: string) => ({ inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: [t] }] });
    const routes: { path: string; body: Record<string, unknown>; row: (answer: any) => number[] }[] = [
      { path: '/embed', body: { inputs: [text] }, row: (a) => a[0] },
      { path: '/', body: { inputs: [text], model: 'tiny-embed' }, row: (a) => a[0] },
      { path: '/v1/embeddings', body: { input: text, model: 'tiny-embed' }, row: (a) => a.data[0].embedding },
      { path: '/v2/models/tiny-embed/infer', body: kserve(text), row: (a) => a.outputs[0].data },
      { path: '/similarity', body: { inputs: { source_sentence: text, sentences: [text] } }, row: (a) => a },
    ];
    const cut = tok.encode(text, { maxLength: MAX_LENGTH, truncate: true });
    expect(cut.truncated).toBe(true);
    const want = await embedRef.embedding(cut.ids);
    for (const { path, body, row } of routes) {
      const refused = await post(server, path, body);
      expect(refused.status, path).toBe(path === '/v1/embeddings' ? 400 : 413);
      const advice = adviceOf(messageOf(refused.body));
      expect(advice, messageOf(refused.body)).not.toBeNull();
      const followed = await post(server, path, merged(body, advice!));
      expect(followed.status, `${path} with ${JSON.stringify(advice)}: ${JSON.stringify(followed.body).slice(0, 200)}`).toBe(200);
      if (path === '/similarity') expect(Math.abs(row(followed.body)[0] - 1)).toBeLessThan(TOLERANCE); // the cut text against itself
      else expect(maxAbsDiff(Float64Array.from(row(followed.body)), want), path).toBeLessThan(TOLERANCE);
    }
  });

  it('the official OpenAI client can send truncate (our extension) and gets the cut row', async () => {
    const openai = new OpenAI({ baseURL: server.url + '/v1', apiKey: 'unused', maxRetries: 0 });
    const text = long(makeRandom('openai truncate'));
    const err = await openai.embeddings.create({ model: 'tiny-embed', input: text }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(BadRequestError);
    expect((err as BadRequestError).code).toBe('context_length_exceeded');
    const r = await openai.embeddings.create({ model: 'tiny-embed', input: text, encoding_format: 'float', truncate: true } as never);
    const want = await embedRef.embedding(tok.encode(text, { maxLength: MAX_LENGTH, truncate: true }).ids);
    expect(maxAbsDiff(Float64Array.from(r.data[0]!.embedding), want)).toBeLessThan(TOLERANCE);
  });

  it('--truncate cuts when the request does not say; a request that says truncate: false is still refused', async () => {
    const text = long(makeRandom('--truncate'));
    const want = await embedRef.embedding(tok.encode(text, { maxLength: MAX_LENGTH, truncate: true }).ids);
    const cutByDefault = await post(rerankFirst, '/embed', { inputs: [text] });
    expect(cutByDefault.status).toBe(200);
    expect(maxAbsDiff(Float64Array.from(cutByDefault.body[0]), want)).toBeLessThan(TOLERANCE);
    expect((await post(rerankFirst, '/v1/embeddings', { input: text, model: 'tiny-embed' })).status).toBe(200);
    expect((await post(rerankFirst, '/embed', { inputs: [text], truncate: false })).status).toBe(413);
    expect((await post(server, '/embed', { inputs: [text] })).status).toBe(413); // the default: refused
    expect((await (await fetch(rerankFirst.url + '/info')).json()).limits.truncate).toBe(true);
  });
});

/** The JSON fragment an error's advice says to send (`send "truncate": true ...`, `send "parameters": {"truncate": true} ...`), or null. */
function adviceOf(message: string): Record<string, unknown> | null {
  const m = /send ("[a-z_]+": (?:true|\{"[a-z_]+": true\}))/.exec(message);
  return m ? (JSON.parse(`{${m[1]}}`) as Record<string, unknown>) : null;
}

/** `body` with `extra`'s fields added (one level of objects merged). */
function merged(body: Record<string, unknown>, extra: Record<string, unknown>): Record<string, unknown> {
  const out = { ...body };
  for (const [k, v] of Object.entries(extra)) out[k] = typeof v === 'object' && v !== null ? { ...(body[k] as object), ...v } : v;
  return out;
}

// ------------------------------------------------------------ Hugging Face's text-classification task

describe('text classification for Hugging Face\'s client and TEI\'s', () => {
  it('@huggingface/inference textClassification with a string reads /predict, /models/{name}/predict and the root; scores are the graph\'s softmax', async () => {
    const rand = makeRandom('hf textClassification');
    const text = randomTexts(rand, words, 1, 12)[0]!;
    const want = await intentRef.classification(tok.encode(text, { maxLength: MAX_LENGTH, truncate: false }).ids);
    const hf = new InferenceClient();
    for (const url of [server.url + '/predict', server.url + '/models/tiny-intent/predict', rerankFirst.url]) {
      const got = await hf.textClassification({ endpointUrl: url, inputs: text });
      expect(got.length, url).toBe(intentRef.spec.labels.length);
      for (const { label, score } of got) expect(Math.abs(score - want.probabilities[intentRef.spec.labels.indexOf(label)]!), `${url} ${label}`).toBeLessThan(TOLERANCE);
      for (let i = 1; i < got.length; i++) expect(got[i - 1]!.score).toBeGreaterThanOrEqual(got[i]!.score);
    }
    // Hugging Face's parameters: top_k, and function_to_apply "none" (the logits).
    const top = await hf.textClassification({ endpointUrl: server.url + '/predict', inputs: text, parameters: { top_k: 2, function_to_apply: 'none' } });
    const logits = intentRef.spec.labels.map((label, i) => ({ label, score: want.logits[i]! })).sort((a, b) => b.score - a.score);
    expect(top.map((x) => x.label)).toEqual(logits.slice(0, 2).map((x) => x.label));
    expect(Math.abs(top[0]!.score - logits[0]!.score)).toBeLessThan(TOLERANCE);
  });

  it('TEI\'s body from any other client keeps TEI\'s shape: a string gets its list of labels, a list one list per input', async () => {
    const one = await post(server, '/predict', { inputs: 'I want my money back' });
    expect(one.status).toBe(200);
    expect(typeof one.body[0].label).toBe('string'); // [{label, score}], not [[...]]
    const many = await post(server, '/predict', { inputs: ['I want my money back', 'hi'] });
    expect(many.body.map((l: unknown[]) => l.length)).toEqual([8, 8]);
    // The same body from Hugging Face's client (its User-Agent), or with its `parameters`: [[{label, score}]].
    const hfAgent = await post(server, '/predict', { inputs: 'I want my money back' }, { 'user-agent': '@huggingface/inference/4.13.30' });
    expect(Array.isArray(hfAgent.body[0])).toBe(true);
    expect(hfAgent.body[0]).toEqual(one.body);
    const hfBody = await post(server, '/predict', { inputs: 'I want my money back', parameters: { top_k: 3 } });
    expect(hfBody.body).toEqual([one.body.slice(0, 3)]);
  });
});

// ------------------------------------------------------------ POST / by body shape

describe('POST / without a model', () => {
  it('routes by the body\'s shape: query + texts to the reranker, inputs.source_sentence to similarity, inputs to the first embedder or classifier', async () => {
    const rerank = { query: 'where is my parcel', texts: ['has it shipped?', 'cancel my plan'] };
    const similarity = { inputs: { source_sentence: 'where is my parcel', sentences: ['has it shipped?', 'cancel my plan'] } };
    const inputs = { inputs: ['where is my parcel'] };
    for (const [srv, first] of [
      [server, '/embed'],
      [rerankFirst, '/predict'],
    ] as const) {
      expect(await post(srv, '/', rerank)).toEqual(await post(srv, '/rerank', rerank));
      expect(await post(srv, '/', similarity)).toEqual(await post(srv, '/similarity', similarity));
      const root = await post(srv, '/', inputs);
      expect(root.status).toBe(200);
      expect(root).toEqual(await post(srv, first, inputs));
    }
  });

  it('a named model\'s task decides, and a body of another task is refused saying "model" picks it; a body of no task lists them', async () => {
    const wrong = await post(server, '/', { query: 'q', texts: ['a'], model: 'tiny-embed' });
    expect(wrong.status).toBe(422);
    expect(wrong.body.error).toMatch(/model "tiny-embed" \(task embed\) takes the body of \/embed or \/similarity, not a \/rerank body.*"model" picks the task/);
    const none = await post(server, '/', { sentences: ['a'] });
    expect(none.status).toBe(422);
    expect(none.body.error).toContain('/rerank {"query", "texts"}');
    expect((await post(server, '/', { inputs: 'hi', model: 'tiny-intent' })).body).toEqual((await post(server, '/predict', { inputs: 'hi' })).body);
  });
});
