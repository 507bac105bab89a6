/**
 * Property-based fuzzing (fast-check) of everything a client can send, against
 * a real server: startServer() with testServerConfig (real gateway thread,
 * uWebSockets.js, the real inference thread and onnxruntime on CPU, the
 * generated tiny models), run in a child process (test/fixtures/child-server.ts)
 * so that a crash is a reported exit instead of the end of the test runner.
 *
 * What it checks:
 *  - HTTP decoders: arbitrary bytes, mutated valid bodies, structured-but-wrong
 *    JSON and msgpack (fc.anything, wrong types, huge numbers, deep nesting,
 *    invalid UTF-8, random Content-Type / Accept / x-deadline-ms / x-priority)
 *    sent to every POST route. Every answer is a 2xx or a 4xx (a 504 only when
 *    the request itself set a deadline) in its dialect's error shape (ours
 *    `{error, error_type, type, code}`, Cohere's `{id, message}`, vLLM's and OpenAI's `{error: {message, type, param, code}}`,
 *    KServe's `{error}`), encoded per Accept, never a 5xx, never a hang.
 *  - Raw HTTP framing: arbitrary request lines, header garbage, bad chunked
 *    encoding, smuggling-style CL/TE mixes on a raw socket: a clean non-5xx
 *    answer or a close, and the server keeps serving another connection.
 *  - WebSocket decoder: random binary and text frames, msgpack of fc.anything,
 *    wrong op shapes, oversized frames: only well-formed answer frames, every
 *    request with a unique id answered exactly once, the socket still serves
 *    (or was closed 1009 for a frame over the limit), a bystander socket keeps
 *    working; and raw WebSocket framing garbage after a real upgrade.
 *  - Slot state machine (src/shared/slab.ts): model-based (fc.commands) runs
 *    of the real SlabSubmitter and the real InferenceLoop on this thread, with
 *    a runner whose batches the commands finish or fail, interleaved with
 *    submits, cancels, expired deadlines and event-loop turns; after every
 *    command the slab is checked (each slot in exactly one place, free list
 *    without duplicates, generations = acquisitions, pending = unsettled) and
 *    at the end every request settled once with its own row and every slot
 *    is free.
 * Each server block ends by checking the server is alive, no slot is in use,
 * nothing is queued and no thread error was logged.
 *
 * Replaying a failure: every property prints `fuzz <name>: seed S` and, when
 * it fails, fast-check prints the seed and the counterexample path. Run
 *   SLABSERVE_FUZZ_SEED=S SLABSERVE_FUZZ_PATH=P npx vitest run test/fuzz.test.ts -t "<test name>"
 * to replay exactly the shrunk case (SLABSERVE_FUZZ_SEED alone replays the
 * whole run). SLABSERVE_FUZZ_RUNS=k multiplies every property's run count.
 */
import { writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pack, unpack } from 'msgpackr';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import WebSocket from 'ws';
import { InferenceLoop, type LoopRunner } from '../dist/src/gpu-worker/inference-loop.js';
import type { BatchingOptions } from '../dist/src/gpu-worker/scheduler.js';
import { ControlBlock } from '../dist/src/shared/control.js';
import { CancelledError, DeadlineExceededError, EngineClosedError, InferenceError, OverloadedError } from '../dist/src/shared/errors.js';
import { H_GENERATION, H_LENGTH, HEADER_I32, Slab, SlotState } from '../dist/src/shared/slab.js';
import { SlabSubmitter, type SlotResult } from '../dist/src/core/submitter.js';
import { TEI_ERROR_TYPE } from '../dist/src/gateway/http/request-context.js';
import { ChildServer, sleep } from './fixtures/child-server.js';
import { maxAbsDiff, NEWER_UWS, Reference, testServerConfig, vocabularyWords } from './helpers.js';

const MODELS = ['tiny-embed', 'tiny-intent', 'tiny-rerank'] as const;
const MAX_INPUTS = 8;
const MAX_BODY = 256 * 1024;
const WS_MAX_FRAME = 64 * 1024;
const VOCAB = 30_522;
/** A request not answered within this is a hang. */
const CLIENT_TIMEOUT_MS = 20_000;
const RUNS = Number(process.env.SLABSERVE_FUZZ_RUNS ?? 1);

// ------------------------------------------------------------------ fast-check plumbing

/** fast-check parameters for one property: a fresh seed (printed) unless SLABSERVE_FUZZ_SEED replays one. */
function params(name: string, numRuns: number): fc.Parameters<unknown> {
  const seed = Number(process.env.SLABSERVE_FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 31));
  const path = process.env.SLABSERVE_FUZZ_PATH;
  console.log(`fuzz ${name}: seed ${seed}${path ? ` path ${path}` : ''}, ${Math.ceil(numRuns * RUNS)} runs`);
  return { seed, ...(path ? { path } : {}), numRuns: Math.ceil(numRuns * RUNS), includeErrorInReport: true };
}

/**
 * Runs `property`; a failure is rethrown with the first failing case as it was
 * first seen (shrinking replays cases against a live server, and once a server
 * has crashed every replay fails the same way: the first case is the cause).
 */
async function check<T>(name: string, arb: fc.Arbitrary<T>, numRuns: number, run: (v: T) => Promise<void>, server?: ChildServer): Promise<void> {
  let first: string | null = null;
  const property = fc.asyncProperty(arb, async (v) => {
    try {
      if (server && !server.alive) throw new Error(`the server process died: ${server.describeDeath()}`);
      await run(v);
    } catch (err) {
      if (first === null) {
        // The whole case, for a look at what the (shortened) message leaves out.
        const file = join(tmpdir(), `slabserve-fuzz-${name.replace(/\W+/g, '-')}-${process.pid}.txt`);
        writeFileSync(file, fc.stringify(v));
        first = `${(err as Error).message}\n  case: ${show(v)}\n  (the whole case: ${file})`;
      }
      throw err;
    }
  });
  try {
    await fc.assert(property, params(name, numRuns));
  } catch (err) {
    throw new Error(`fuzz ${name} failed. First failure:\n${first}\n\n${(err as Error).message}`);
  }
}

/** A short printable form of a generated case. */
function show(v: unknown): string {
  return fc.stringify(v).slice(0, 2000);
}

// ------------------------------------------------------------------ encoders and generators

/** JSON with BigInts written as integer literals (so huge integers reach the server's JSON.parse). */
function toJson(v: unknown): string {
  const s = JSON.stringify(v, (_k, x) => (typeof x === 'bigint' ? `__big${x}__` : x));
  return s === undefined ? '' : s.replace(/"__big(-?\d+)__"/g, '$1');
}

function toMsgpack(v: unknown): Uint8Array {
  try {
    return pack(v);
  } catch {
    return Buffer.from(toJson(v)); // what msgpack cannot carry (a BigInt past 64 bits) goes as JSON bytes
  }
}

const encode = (v: unknown, as: 'json' | 'msgpack'): Uint8Array => (as === 'json' ? Buffer.from(toJson(v)) : toMsgpack(v));

const asciiString = (maxLength: number) => fc.string({ unit: 'grapheme-ascii', maxLength });
const loneSurrogate = fc.integer({ min: 0xd800, max: 0xdfff }).map((c) => String.fromCharCode(c));
/** Any string: ASCII, any code point, graphemes, lone surrogates, controls. */
const anyString = (maxLength: number) =>
  fc.oneof(
    fc.string({ maxLength }),
    fc.string({ unit: 'binary', maxLength }),
    fc.string({ unit: 'grapheme', maxLength }),
    fc.string({ unit: 'binary-ascii', maxLength }),
    fc.string({ unit: fc.oneof(loneSurrogate, fc.constantFrom('a', ' ', '\u0000', '\u2028', '\ufeff', '\ud83d\ude00')), maxLength }),
  );

let words: string[] = ['hello', 'world', 'where', 'is', 'my', 'parcel'];
const wordsText = fc.array(fc.nat(), { minLength: 1, maxLength: 12 }).map((ks) => ks.map((k) => words[k % words.length]).join(' '));
const text = fc.oneof({ weight: 3, arbitrary: wordsText }, { weight: 2, arbitrary: anyString(40) });

const weirdNumber = fc.oneof(
  fc.integer(),
  fc.double(),
  fc.constantFrom(-1, 0, -0, 1.5, 2 ** 31, 2 ** 32, 2 ** 53, 2 ** 53 + 2, 1e21, 1e308, -1e308, Number.MAX_SAFE_INTEGER, Number.MIN_VALUE, NaN, Infinity, -Infinity, VOCAB, VOCAB - 1),
  fc.bigInt({ min: -(2n ** 63n), max: 2n ** 64n - 1n }),
  fc.bigInt({ min: 2n ** 64n, max: 2n ** 80n }),
);
const anything = fc.anything({
  maxDepth: 3,
  maxKeys: 4,
  withBigInt: true,
  withBoxedValues: true,
  withDate: true,
  withMap: true,
  withSet: true,
  withNullPrototype: true,
  withSparseArray: true,
  withTypedArray: true,
  stringUnit: 'binary',
});
const wrong = fc.oneof(weirdNumber, fc.constant(null), fc.boolean(), anyString(12), fc.array(anything, { maxLength: 3 }), fc.dictionary(asciiString(6), anything, { maxKeys: 3 }), anything);
/** Mostly a right value, sometimes a wrong one. */
const field = <T>(right: fc.Arbitrary<T>) => fc.oneof({ weight: 4, arbitrary: right }, { weight: 1, arbitrary: wrong });

const tokenIds = fc.oneof(
  { weight: 3, arbitrary: fc.array(fc.integer({ min: 103, max: VOCAB - 1 }), { maxLength: 12 }).map((a) => [101, ...a, 102]) },
  { weight: 1, arbitrary: fc.array(fc.oneof(fc.integer({ min: 0, max: VOCAB + 5 }), weirdNumber), { maxLength: 6 }) },
);
const modelName = fc.oneof({ weight: 4, arbitrary: fc.constantFrom(...MODELS) }, { weight: 1, arbitrary: anyString(12) });

/** KServe tensors: well-formed token and text tensors, and tensors with any field wrong. */
const tokenTensors = fc
  .record({ b: fc.integer({ min: 1, max: 3 }), t: fc.integer({ min: 1, max: 6 }), pad: fc.boolean(), types: fc.boolean(), datatype: fc.constantFrom('INT64', 'INT32') })
  .chain(({ b, t, pad, types, datatype }) =>
    fc.record({
      ids: fc.array(fc.integer({ min: 0, max: VOCAB - 1 }), { minLength: b * t, maxLength: b * t }),
      lens: fc.array(fc.integer({ min: 1, max: t }), { minLength: b, maxLength: b }),
      typeIds: fc.array(fc.integer({ min: 0, max: 1 }), { minLength: b * t, maxLength: b * t }),
    }).map(({ ids, lens, typeIds }) => [
      { name: 'input_ids', shape: [b, t], datatype, data: ids },
      ...(pad ? [{ name: 'attention_mask', shape: [b, t], datatype, data: lens.flatMap((l) => Array.from({ length: t }, (_, j) => (j < l ? 1 : 0))) }] : []),
      ...(types ? [{ name: 'token_type_ids', shape: [b, t], datatype, data: typeIds }] : []),
    ]),
  );
const textTensors = fc.record({ texts: fc.array(text, { minLength: 1, maxLength: 4 }), query: text }).map(({ texts, query }) => [
  { name: 'text', shape: [texts.length], datatype: 'BYTES', data: texts },
  ...(texts.length % 2 ? [{ name: 'query', shape: [1], datatype: 'BYTES', data: [query] }] : []),
]);
const anyTensor = fc.record(
  {
    name: fc.oneof(fc.constantFrom('input_ids', 'attention_mask', 'token_type_ids', 'text', 'query'), anyString(8), wrong),
    shape: fc.oneof(fc.array(fc.nat({ max: 6 }), { maxLength: 3 }), fc.array(weirdNumber, { maxLength: 3 }), wrong),
    datatype: fc.oneof(fc.constantFrom('INT64', 'INT32', 'BYTES', 'FP32', 'BOOL'), anyString(6), wrong),
    data: fc.oneof(fc.array(fc.oneof(fc.integer({ min: -2, max: VOCAB + 2 }), text, weirdNumber, fc.array(fc.nat({ max: VOCAB }), { maxLength: 4 }), anything), { maxLength: 12 }), wrong),
    parameters: wrong,
  },
  { requiredKeys: [] },
);
const tensors = fc.oneof(tokenTensors, textTensors, fc.array(anyTensor, { maxLength: 3 }), fc.tuple(tokenTensors, anyTensor).map(([a, b]) => [...a, b]));

/** TEI / core `inputs`: a text, texts, token ids, a mix; or KServe tensors (the same field name). */
const inputs = fc.oneof(
  text,
  fc.array(text, { maxLength: MAX_INPUTS + 2 }),
  tokenIds,
  fc.array(fc.oneof(text, tokenIds), { maxLength: MAX_INPUTS + 2 }),
  tensors,
);

/** One body carrying every route's fields, each right, wrong or absent: every route gets something to chew on. */
const universalBody = fc
  .tuple(
    fc.record(
      {
        inputs: field(inputs),
        input: field(fc.oneof(text, fc.array(text, { maxLength: MAX_INPUTS + 2 }), tokenIds, fc.array(tokenIds, { maxLength: 4 }))),
        query: field(text),
        texts: field(fc.array(text, { maxLength: MAX_INPUTS + 2 })),
        ids: field(fc.oneof(tokenIds, fc.array(tokenIds, { maxLength: 4 }))),
        model: field(modelName),
        normalize: field(fc.boolean()),
        truncate: field(fc.boolean()),
        raw_scores: field(fc.boolean()),
        return_text: field(fc.boolean()),
        add_special_tokens: field(fc.boolean()),
        skip_special_tokens: field(fc.boolean()),
        encoding_format: field(fc.constantFrom('float', 'base64')),
        dimensions: field(fc.integer({ min: 1, max: 200 })),
        user: field(asciiString(8)),
        timeout: field(fc.oneof(fc.integer({ min: 1, max: 60_000 }), fc.double({ min: 0, max: 5 }))),
        priority: field(fc.oneof(fc.constantFrom('interactive', 'bulk', 'nope'), fc.integer({ min: -3, max: 5 }))),
        id: field(asciiString(8)),
        // Cohere's, Jina's and vLLM's fields
        documents: field(fc.array(fc.oneof(text, fc.record({ text }, { requiredKeys: [] })), { maxLength: MAX_INPUTS + 2 })),
        top_n: field(fc.integer({ min: -1, max: 12 })),
        return_documents: field(fc.boolean()),
        max_tokens_per_doc: field(fc.integer({ min: -1, max: 600 })),
        input_type: field(fc.constantFrom('search_query', 'search_document', 'classification', 'clustering', 'image', 'nope')),
        embedding_types: field(fc.array(fc.constantFrom('float', 'int8', 'uint8', 'binary', 'ubinary', 'base64', 'nope'), { maxLength: 7 })),
        output_dimension: field(fc.integer({ min: 0, max: 200 })),
        text_1: field(fc.oneof(text, fc.array(text, { maxLength: 4 }))),
        text_2: field(fc.oneof(text, fc.array(text, { maxLength: 4 }))),
        queries: field(fc.oneof(text, fc.array(text, { maxLength: 4 }))),
        truncate_prompt_tokens: field(fc.integer({ min: -2, max: 600 })),
        use_activation: field(fc.boolean()),
        parameters: field(fc.record({ normalize: fc.boolean(), truncate: fc.boolean() }, { requiredKeys: [] })),
        outputs: field(fc.array(fc.record({ name: fc.constantFrom('embedding', 'probabilities', 'logits', 'score', 'nope') }), { maxLength: 3 })),
      },
      { requiredKeys: [] },
    ),
    fc.dictionary(anyString(6), anything, { maxKeys: 2 }),
  )
  .map(([known, extra]) => ({ ...extra, ...known }));

const contentTypes = [
  'application/json',
  'application/msgpack',
  'application/x-msgpack',
  'application/vnd.msgpack',
  'application/json; charset=utf-8',
  'APPLICATION/JSON',
  'application/msgpack; q=1',
  'text/plain',
  'application/octet-stream',
  'multipart/form-data; boundary=x',
  'application/x-www-form-urlencoded',
  ';',
];
const acceptValues = ['application/json', 'application/msgpack', 'application/x-msgpack', '*/*', 'text/html', 'application/json, application/msgpack;q=0.5'];

interface HttpCase {
  body: Uint8Array;
  contentType: string | undefined;
  accept: string | undefined;
  deadlineHeader: string | undefined;
  priorityHeader: string | undefined;
  model: string;
  version: string;
}

/** A case around `bodies` (bytes and the encoding they were made in): headers, path model and version drawn too. */
function httpCase(bodies: fc.Arbitrary<{ body: Uint8Array; as: 'json' | 'msgpack' | 'bytes' }>): fc.Arbitrary<HttpCase> {
  return fc
    .record({
      b: bodies,
      typeChoice: fc.oneof({ weight: 6, arbitrary: fc.constant('match') }, { weight: 2, arbitrary: fc.constantFrom(...contentTypes) }, { weight: 1, arbitrary: asciiString(20) }, { weight: 1, arbitrary: fc.constant('none') }),
      accept: fc.option(fc.oneof(fc.constantFrom(...acceptValues), asciiString(20)), { freq: 2 }),
      deadlineHeader: fc.option(fc.oneof(fc.constantFrom('1', '0', '-5', '1e3', 'abc', '60000', 'Infinity', '0.001'), asciiString(8)), { freq: 8 }),
      priorityHeader: fc.option(fc.oneof(fc.constantFrom('interactive', 'bulk', 'BULK', 'nope'), asciiString(8)), { freq: 8 }),
      model: fc.oneof({ weight: 5, arbitrary: fc.constantFrom(...MODELS) }, { weight: 1, arbitrary: fc.constantFrom('', 'nope', '..', '%00', 'tiny-embed ', '__proto__', 'constructor') }, { weight: 1, arbitrary: anyString(10) }),
      version: fc.oneof({ weight: 4, arbitrary: fc.constant('1') }, { weight: 1, arbitrary: fc.constantFrom('2', '0', 'latest', '') }),
    })
    .map(({ b, typeChoice, accept, deadlineHeader, priorityHeader, model, version }) => ({
      body: b.body,
      contentType:
        typeChoice === 'none' ? undefined : typeChoice === 'match' ? (b.as === 'msgpack' ? 'application/msgpack' : b.as === 'json' ? 'application/json' : 'application/octet-stream') : typeChoice,
      accept: accept ?? undefined,
      deadlineHeader: deadlineHeader ?? undefined,
      priorityHeader: priorityHeader ?? undefined,
      model,
      version,
    }));
}

const as = fc.constantFrom('json' as const, 'msgpack' as const);
const encoded = (values: fc.Arbitrary<unknown>) => fc.tuple(values, as).map(([v, a]) => ({ body: encode(v, a), as: a }));

/** Valid requests of every route (a request is valid for one route and wrong for the others). */
const validBody = fc.oneof(
  fc.record({ inputs: fc.oneof(wordsText, fc.array(wordsText, { minLength: 1, maxLength: 4 })) }),
  fc.record({ query: wordsText, texts: fc.array(wordsText, { minLength: 1, maxLength: 4 }) }),
  fc.record({ ids: fc.array(fc.integer({ min: 0, max: VOCAB - 1 }), { minLength: 1, maxLength: 8 }) }),
  fc.record({ input: wordsText, model: fc.constant('tiny-embed') }),
  fc.record({ query: wordsText, documents: fc.array(wordsText, { minLength: 1, maxLength: 4 }), model: fc.constant('tiny-rerank'), top_n: fc.integer({ min: 1, max: 6 }) }),
  fc.record({ texts: fc.array(wordsText, { minLength: 1, maxLength: 4 }), model: fc.constant('tiny-embed'), input_type: fc.constant('search_query'), embedding_types: fc.constant(['float', 'int8', 'binary']) }),
  fc.record({ text_1: wordsText, text_2: fc.array(wordsText, { minLength: 1, maxLength: 4 }) }),
  fc.record({ input: fc.array(wordsText, { minLength: 1, maxLength: 4 }), model: fc.constant('tiny-intent') }),
  tokenTensors.map((t) => ({ inputs: t })),
  textTensors.map((t) => ({ inputs: t })),
);

/** Mutations of a byte string: flips, insertions, deletions, truncation, duplication. */
const mutation = fc.record({ kind: fc.constantFrom('flip', 'set', 'insert', 'delete', 'truncate', 'dup'), at: fc.nat(), byte: fc.nat({ max: 255 }), len: fc.integer({ min: 1, max: 8 }) });
function mutate(bytes: Uint8Array, muts: { kind: string; at: number; byte: number; len: number }[]): Uint8Array {
  let b = Buffer.from(bytes);
  for (const m of muts) {
    const at = b.length ? m.at % (b.length + 1) : 0;
    if (m.kind === 'flip' && b.length) b[at % b.length]! ^= 1 << m.byte % 8;
    else if (m.kind === 'set' && b.length) b[at % b.length] = m.byte;
    else if (m.kind === 'insert') b = Buffer.concat([b.subarray(0, at), Buffer.alloc(m.len, m.byte), b.subarray(at)]);
    else if (m.kind === 'delete') b = Buffer.concat([b.subarray(0, at), b.subarray(at + m.len)]);
    else if (m.kind === 'truncate') b = b.subarray(0, at);
    else if (m.kind === 'dup') b = Buffer.concat([b, b.subarray(at, at + m.len * 4)]);
  }
  return b;
}

/** Nesting `depth` levels deep, as JSON text and as msgpack bytes, at a placeholder inside `template`. */
function deepBody(template: unknown, depth: number, kind: 'array' | 'object', a: 'json' | 'msgpack'): Uint8Array {
  if (a === 'json') {
    const deep = kind === 'array' ? '['.repeat(depth) + '1' + ']'.repeat(depth) : '{"a":'.repeat(depth) + '1' + '}'.repeat(depth);
    return Buffer.from(JSON.stringify(template).replace('"__DEEP__"', deep));
  }
  // fixarray of one element, or fixmap {a: ...}, `depth` times, around the integer 1.
  const deep = Buffer.concat([kind === 'array' ? Buffer.alloc(depth, 0x91) : Buffer.alloc(depth * 3, Buffer.from([0x81, 0xa1, 0x61])), Buffer.from([0x01])]);
  const packed = Buffer.from(pack(template));
  const marker = Buffer.from(pack('__DEEP__'));
  const at = packed.indexOf(marker);
  return Buffer.concat([packed.subarray(0, at), deep, packed.subarray(at + marker.length)]);
}

const deepTemplates: unknown[] = [
  { inputs: '__DEEP__' },
  { inputs: ['a', '__DEEP__'] },
  { input: '__DEEP__', model: 'tiny-embed' },
  { query: 'q', texts: '__DEEP__' },
  { ids: '__DEEP__' },
  { inputs: 'hi', model: '__DEEP__' },
  { inputs: [{ name: 'input_ids', shape: [1, 1], datatype: 'INT64', data: ['__DEEP__'] }], ids: [101], texts: ['t'], query: 'q' },
  { inputs: [{ name: 'input_ids', shape: [1, 1], datatype: 'INT32', data: ['__DEEP__'] }], input: 'x', model: 'tiny-embed' },
  { inputs: [{ name: 'text', shape: [1], datatype: 'BYTES', data: ['__DEEP__'] }] },
  { inputs: [{ name: 'input_ids', shape: [1, 1], datatype: 'INT64', data: [5], parameters: '__DEEP__' }], parameters: { normalize: true } },
  { inputs: 'hi', parameters: '__DEEP__', timeout: 1000 },
];

/** Numbers JSON and msgpack can spell that JavaScript cannot hold exactly, in every numeric field. */
const hugeNumberTexts = ['1e400', '-1e400', '18446744073709551616', '1' + '0'.repeat(400), '1.0', '1e-400', '-0', '9007199254740993', '0.5e1', '30521.0000000000001'];
/** Every numeric field of every route at once (each route reads its own): the odd number reaches them all in one body. */
const hugeTemplates = [
  (n: string) => `{"inputs":[{"name":"input_ids","shape":[1,1],"datatype":"INT64","data":[${n}]}],"ids":[${n}],"input":[101,${n},102],"model":"tiny-embed","texts":["t"],"query":"q"}`,
  (n: string) => `{"inputs":[101,${n},102],"ids":[[${n}]],"input":[[101,${n},102]],"model":"tiny-embed","dimensions":${n}}`,
  (n: string) => `{"inputs":[{"name":"input_ids","shape":[1,${n}],"datatype":"INT64","data":[101]}],"input":"x","model":"tiny-embed","timeout":${n}}`,
  (n: string) => `{"inputs":[{"name":"text","shape":[${n}],"datatype":"BYTES","data":["a"]}],"texts":["t"],"query":"q","timeout":${n}}`,
];
/** Raw msgpack numbers: uint64 max, int64 min, a small uint64, float64 NaN / Infinity / 1e300. */
const msgpackNumbers = [
  [0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
  [0xd3, 0x80, 0, 0, 0, 0, 0, 0, 0],
  [0xcf, 0, 0, 0, 0, 0, 0, 0x77, 0x7a],
  [0xcb, 0x7f, 0xf8, 0, 0, 0, 0, 0, 0],
  [0xcb, 0x7f, 0xf0, 0, 0, 0, 0, 0, 0],
  [0xcb, 0x7e, 0x37, 0xe4, 0x3c, 0x88, 0x00, 0x75, 0x9c],
];
/** `template` packed, with the raw msgpack `number` at every '__N__'. */
function msgpackWithNumber(template: unknown, number: number[]): Uint8Array {
  const marker = Buffer.from(pack('__N__'));
  const parts: Buffer[] = [];
  let rest = Buffer.from(pack(template));
  for (let at = rest.indexOf(marker); at >= 0; at = rest.indexOf(marker)) {
    parts.push(rest.subarray(0, at), Buffer.from(number));
    rest = rest.subarray(at + marker.length);
  }
  return Buffer.concat([...parts, rest]);
}
const msgpackNumberTemplates: unknown[] = [
  { inputs: [{ name: 'input_ids', shape: [1, 1], datatype: 'INT64', data: ['__N__'] }], ids: ['__N__'], input: [101, '__N__', 102], model: 'tiny-embed', texts: ['t'], query: 'q' },
  { inputs: [101, '__N__', 102], ids: [['__N__']], input: [[101, '__N__', 102]], model: 'tiny-embed', dimensions: '__N__' },
  { inputs: [{ name: 'input_ids', shape: [1, '__N__'], datatype: 'INT64', data: [101] }], input: 'x', model: 'tiny-embed', timeout: '__N__' },
  { inputs: [{ name: 'text', shape: ['__N__'], datatype: 'BYTES', data: ['a'] }], texts: ['t'], query: 'q', timeout: '__N__' },
  { inputs: 'hi', texts: ['t'], query: 'q', ids: [101], timeout: '__N__', dimensions: '__N__', deadline_ms: '__N__', credit: '__N__' },
];

// ------------------------------------------------------------------ HTTP: sending and judging

type Dialect = 'ours' | 'openai' | 'kserve' | 'cohere' | 'jina' | 'vllm';
interface RouteSpec {
  path: string;
  dialect: Dialect;
  kind: 'embed' | 'predict' | 'rerank' | 'tokenize' | 'decode' | 'openai' | 'kserve' | 'cohere-rerank' | 'cohere-embed' | 'vllm';
}

/** `s` with lone surrogates replaced (encodeURIComponent throws on them). */
const wellFormed = (s: string) => s.replace(/[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g, '\ufffd');

function routesFor(model: string, version: string): RouteSpec[] {
  const m = encodeURIComponent(wellFormed(model));
  const v = encodeURIComponent(wellFormed(version));
  return [
    { path: '/embed', dialect: 'ours', kind: 'embed' },
    { path: '/predict', dialect: 'ours', kind: 'predict' },
    { path: `/models/${m}/embed`, dialect: 'ours', kind: 'embed' },
    { path: `/models/${m}/predict`, dialect: 'ours', kind: 'predict' },
    { path: '/rerank', dialect: 'ours', kind: 'rerank' },
    { path: '/tokenize', dialect: 'ours', kind: 'tokenize' },
    { path: '/decode', dialect: 'ours', kind: 'decode' },
    { path: `/models/${m}/rerank`, dialect: 'ours', kind: 'rerank' },
    { path: `/models/${m}/tokenize`, dialect: 'ours', kind: 'tokenize' },
    { path: `/models/${m}/decode`, dialect: 'ours', kind: 'decode' },
    { path: '/v1/embeddings', dialect: 'openai', kind: 'openai' },
    { path: '/v2/rerank', dialect: 'cohere', kind: 'cohere-rerank' },
    { path: '/v1/rerank', dialect: 'jina', kind: 'cohere-rerank' },
    { path: '/v2/embed', dialect: 'cohere', kind: 'cohere-embed' },
    { path: '/score', dialect: 'vllm', kind: 'vllm' },
    { path: '/v1/classify', dialect: 'vllm', kind: 'vllm' },
    { path: `/v2/models/${m}/infer`, dialect: 'kserve', kind: 'kserve' },
    { path: `/v2/models/${m}/versions/${v}/infer`, dialect: 'kserve', kind: 'kserve' },
  ];
}

const ERROR_TYPES = new Set(['validation', 'too_long', 'payload_too_large', 'not_found', 'method_not_allowed', 'unsupported_media_type', 'overloaded', 'timeout', 'cancelled', 'backend', 'unavailable']);
const CLIENT_ERRORS = new Set([400, 404, 413, 415, 422, 429]);

interface HttpReply {
  status: number;
  contentType: string;
  body: unknown;
  raw: Buffer;
}

async function post(base: string, route: RouteSpec, c: HttpCase): Promise<HttpReply> {
  const headers: Record<string, string> = {};
  if (c.contentType !== undefined) headers['content-type'] = c.contentType;
  if (c.accept !== undefined) headers.accept = c.accept;
  if (c.deadlineHeader !== undefined) headers['x-deadline-ms'] = c.deadlineHeader;
  if (c.priorityHeader !== undefined) headers['x-priority'] = c.priorityHeader;
  let res: Response;
  try {
    res = await fetch(base + route.path, { method: 'POST', headers, body: c.body, signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS) });
  } catch (err) {
    const e = err as Error & { cause?: Error };
    if (e.name === 'TimeoutError') throw new Error(`POST ${route.path}: no answer within ${CLIENT_TIMEOUT_MS} ms (a hang)`);
    throw new Error(`POST ${route.path}: ${e.message} (${e.cause?.message ?? 'no cause'})`);
  }
  const raw = Buffer.from(await res.arrayBuffer());
  const contentType = res.headers.get('content-type') ?? '';
  let body: unknown = raw.toString('utf8');
  if (contentType === 'application/msgpack') body = unpack(raw);
  else if (contentType === 'application/json') body = JSON.parse(raw.toString('utf8'));
  return { status: res.status, contentType, body, raw };
}

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v) && !(v instanceof Uint8Array);
const keys = (v: Record<string, unknown>) => Object.keys(v).sort().join(',');

/** Every number in `v` is finite (a NaN or an Infinity in an answer is a bug). */
function allFinite(v: unknown, depth = 0): boolean {
  if (typeof v === 'number') return Number.isFinite(v);
  if (depth > 8 || v === null || typeof v !== 'object') return true;
  return Object.values(v as object).every((x) => allFinite(x, depth + 1));
}

/** What is wrong with an answer, or null. */
function judge(route: RouteSpec, c: HttpCase, r: HttpReply): string | null {
  const wantType = c.accept && /application\/(x-)?msgpack/.test(c.accept.toLowerCase()) ? 'application/msgpack' : 'application/json';
  const hadDeadline = c.deadlineHeader !== undefined || Buffer.from(c.body).includes('timeout');
  if (r.contentType !== wantType) return `content-type ${r.contentType}, expected ${wantType}`;
  if (r.status === 200) {
    if (!allFinite(r.body)) return 'a non-finite number in a 200 answer';
    switch (route.kind) {
      case 'embed':
        return Array.isArray(r.body) && r.body.length > 0 && r.body.every((row) => Array.isArray(row) && row.length > 0) ? null : 'embed answer is not a list of rows';
      case 'predict':
      case 'tokenize':
      case 'rerank':
        return Array.isArray(r.body) && r.body.length > 0 ? null : `${route.kind} answer is not a non-empty list`;
      case 'decode':
        return typeof r.body === 'string' || (Array.isArray(r.body) && r.body.every((s) => typeof s === 'string')) ? null : 'decode answer is not text';
      case 'openai':
        return isObject(r.body) && r.body.object === 'list' && Array.isArray(r.body.data) ? null : 'OpenAI answer is not a list object';
      case 'cohere-rerank':
        return isObject(r.body) && Array.isArray(r.body.results) && isObject(r.body.meta) ? null : 'Cohere rerank answer has no results and meta';
      case 'cohere-embed':
        return isObject(r.body) && isObject(r.body.embeddings) && Array.isArray(r.body.texts) ? null : 'Cohere embed answer has no embeddings and texts';
      case 'vllm':
        return isObject(r.body) && r.body.object === 'list' && Array.isArray(r.body.data) && isObject(r.body.usage) ? null : 'vLLM answer is not a list object with usage';
      case 'kserve': {
        if (!isObject(r.body) || !Array.isArray(r.body.outputs)) return 'KServe answer has no outputs';
        for (const o of r.body.outputs as { shape: number[]; data: unknown[] }[]) {
          if (o.shape.reduce((a, b) => a * b, 1) !== o.data.length) return `KServe output of shape [${o.shape}] holds ${o.data.length} values`;
        }
        return null;
      }
    }
  }
  const timeoutOk = r.status === 504 && hadDeadline;
  const b = r.body;
  // A path with a dot segment (model "." or "..") is not sent as written: the client resolves it
  // (/v2/models/./infer becomes /v2/models/infer), and the route it lands on, if it takes no POST,
  // answers 405.
  const dotSegment = /\/\.\.?(\/|$)/.test(route.path);
  const landedElsewhere = dotSegment && r.status === 405 && isObject(b) && b.code === 'SLABSERVE_METHOD_NOT_ALLOWED';
  if (!CLIENT_ERRORS.has(r.status) && !timeoutOk && !landedElsewhere) return `status ${r.status}${r.status >= 500 ? ' (a server error)' : ''}`;
  // A path no route matches (an empty model name, say) is answered by the catch-all 404: the router's answers are in our shape.
  const byRouter = landedElsewhere || (r.status === 404 && isObject(b) && b.code === 'SLABSERVE_ROUTE_NOT_FOUND');
  if (route.dialect === 'ours' || byRouter) {
    if (!isObject(b) || keys(b) !== 'code,error,error_type,type') return `error body is not {error, error_type, type, code}: ${show(b)}`;
    if (b.error_type !== TEI_ERROR_TYPE[b.type as keyof typeof TEI_ERROR_TYPE]) return `error_type ${String(b.error_type)} is not TEI's kind of ${String(b.type)}`;
    if (typeof b.error !== 'string' || b.error.length === 0 || typeof b.code !== 'string' || !/^SLABSERVE_[A-Z_]+$/.test(b.code) || !ERROR_TYPES.has(b.type as string)) return `bad error fields: ${show(b)}`;
    if (timeoutOk && b.type !== 'timeout') return `504 of type ${b.type}`;
  } else if (route.dialect === 'cohere' || route.dialect === 'jina') {
    const want = route.dialect === 'jina' ? 'code,detail,id,message' : 'code,id,message';
    if (!isObject(b) || keys(b) !== want || typeof b.message !== 'string' || !b.message) return `not Cohere's {id, message} shape: ${show(b)}`;
  } else if (route.dialect === 'vllm') {
    const e = isObject(b) ? b.error : undefined;
    if (!isObject(b) || keys(b) !== 'error' || !isObject(e) || keys(e) !== 'code,message,param,type') return `not vLLM's error shape: ${show(b)}`;
    if (e.code !== r.status || typeof e.message !== 'string' || !e.message || typeof e.type !== 'string') return `bad vLLM error fields: ${show(b)}`;
  } else if (route.dialect === 'openai') {
    const e = isObject(b) ? b.error : undefined;
    if (!isObject(b) || keys(b) !== 'error' || !isObject(e) || keys(e) !== 'code,message,param,type') return `not OpenAI's error shape: ${show(b)}`;
    if (typeof e.message !== 'string' || !e.message || typeof e.type !== 'string' || !(e.param === null || typeof e.param === 'string') || !(e.code === null || typeof e.code === 'string')) return `bad OpenAI error fields: ${show(b)}`;
  } else {
    if (!isObject(b) || keys(b) !== 'error' || typeof b.error !== 'string' || !b.error) return `not KServe's {error} shape: ${show(b)}`;
  }
  return null;
}

/** Sends one case to every POST route at once and judges every answer. */
async function fuzzRoutes(server: ChildServer, c: HttpCase, tally: Map<string, number>): Promise<void> {
  const routes = routesFor(c.model, c.version);
  const replies = await Promise.all(routes.map((r) => post(server.url, r, c)));
  const problems: string[] = [];
  replies.forEach((reply, i) => {
    const route = routes[i]!;
    tally.set(String(reply.status), (tally.get(String(reply.status)) ?? 0) + 1);
    const p = judge(route, c, reply);
    if (p) problems.push(`POST ${route.path} -> ${reply.status}: ${p}; body ${reply.raw.toString('utf8').slice(0, 300)}`);
  });
  if (problems.length) throw new Error(problems.join('\n'));
}

// =================================================================== HTTP decoders

describe('fuzz: HTTP decoders of every POST route', () => {
  let server: ChildServer;
  let embedRef: Reference;
  const tally = new Map<string, number>();
  /** How the server died, each time it did (a test that kills it fails; the next gets a fresh one). */
  const deaths: string[] = [];
  const start = () => ChildServer.start('fuzz-http', testServerConfig({ models: [...MODELS], maxClientBatchSize: MAX_INPUTS, maxBodyBytes: MAX_BODY, batching: { maxBatchTokens: 2048 } }));
  /** The server, restarted if an earlier test killed it. */
  const live = async (): Promise<ChildServer> => {
    if (!server.alive) {
      deaths.push(server.describeDeath());
      server = await start();
    }
    return server;
  };

  beforeAll(async () => {
    embedRef = await Reference.open('tiny-embed');
    words = vocabularyWords(embedRef.spec).slice(0, 2000);
    server = await start();
  });

  afterAll(async () => {
    console.log(`fuzz http: answers by status ${JSON.stringify(Object.fromEntries([...tally].sort()))}`);
    await server?.stop();
    await embedRef?.close();
  });

  it('arbitrary bytes and mutated valid bodies', { timeout: 90_000 }, async () => {
    const bodies = fc.oneof(
      fc.uint8Array({ maxLength: 400 }).map((b) => ({ body: b, as: 'bytes' as const })),
      fc.tuple(validBody, as, fc.array(mutation, { minLength: 1, maxLength: 4 })).map(([v, a, m]) => ({ body: mutate(encode(v, a), m), as: a })),
    );
    await live();
    await check('http bytes', httpCase(bodies), 60, (c) => fuzzRoutes(server, c, tally), server);
  });

  it('structured-but-wrong JSON and msgpack: every field right, wrong or absent; wrong Content-Type and headers', { timeout: 90_000 }, async () => {
    await live();
    await check('http structured', httpCase(encoded(fc.oneof({ weight: 4, arbitrary: universalBody }, { weight: 1, arbitrary: validBody }))), 100, (c) => fuzzRoutes(server, c, tally), server);
  });

  it('fc.anything bodies, bare and in every field', { timeout: 90_000 }, async () => {
    const values = fc.oneof(
      anything,
      fc.record({ inputs: anything }),
      fc.record({ input: anything, model: fc.constant('tiny-embed') }),
      fc.record({ query: anything, texts: anything }),
      fc.record({ ids: anything }),
      fc.record({ inputs: anything, model: anything, truncate: anything, normalize: anything, timeout: anything, priority: anything }),
      fc.record({ inputs: fc.array(fc.record({ name: fc.constantFrom('input_ids', 'text'), shape: anything, datatype: fc.constantFrom('INT64', 'BYTES'), data: anything }), { maxLength: 2 }) }),
    );
    await live();
    await check('http anything', httpCase(encoded(values)), 50, (c) => fuzzRoutes(server, c, tally), server);
  });

  it('deep nesting, huge and non-finite numbers, invalid UTF-8, lone surrogates, long texts, long lists', { timeout: 90_000 }, async () => {
    const bodies = fc.oneof(
      fc
        .record({ t: fc.constantFrom(...deepTemplates), depth: fc.integer({ min: 50, max: 40_000 }), kind: fc.constantFrom('array' as const, 'object' as const), a: as })
        .map(({ t, depth, kind, a }) => ({ body: deepBody(t, depth, kind, a), as: a })),
      fc.record({ t: fc.constantFrom(...hugeTemplates), n: fc.constantFrom(...hugeNumberTexts) }).map(({ t, n }) => ({ body: Buffer.from(t(n)), as: 'json' as const })),
      fc.record({ t: fc.constantFrom(...msgpackNumberTemplates), n: fc.constantFrom(...msgpackNumbers) }).map(({ t, n }) => ({ body: msgpackWithNumber(t, n), as: 'msgpack' as const })),
      fc.record({ t: fc.constantFrom(...msgpackNumberTemplates), n: fc.constantFrom(...msgpackNumbers) }).map(({ t, n }) => ({ body: msgpackWithNumber(t, n), as: 'msgpack' as const })),
      // Invalid UTF-8 inside JSON strings, and inside msgpack str8 headers.
      fc
        .record({ field: fc.constantFrom('inputs', 'query', 'model', 'input'), bytes: fc.uint8Array({ minLength: 1, maxLength: 40 }) })
        .map(({ field: f, bytes }) => ({ body: Buffer.concat([Buffer.from(`{"texts":["x"],"query":"q","model":"tiny-embed","${f}":"`), Buffer.from(bytes.map((x) => (x === 0x22 || x === 0x5c ? 0xff : x))), Buffer.from('"}')]), as: 'json' as const })),
      fc
        .uint8Array({ minLength: 1, maxLength: 40 })
        .map((bytes) => ({ body: Buffer.concat([Buffer.from([0x81, 0xa6]), Buffer.from('inputs'), Buffer.from([0xd9, bytes.length]), Buffer.from(bytes)]), as: 'msgpack' as const })),
      // Escaped lone surrogates and odd code points, a BOM before the body.
      fc.constantFrom('"\\ud800"', '"\\udfff abc"', '"a\\u0000b"', '["\\ud83d", "\\ude00"]', '"\\u2028\\u2029"', '"\\uffff\\ufffe"').map((s) => ({ body: Buffer.from(`{"inputs":${s},"query":${s.startsWith('[') ? '"q"' : s},"texts":[${s.startsWith('[') ? '"t"' : s}],"input":${s},"model":"tiny-embed"}`), as: 'json' as const })),
      fc.constant({ body: Buffer.from('\ufeff{"inputs":"hello"}'), as: 'json' as const }),
      // Long texts (one input far past the max length), long lists, many keys.
      fc.record({ n: fc.integer({ min: 1_000, max: 200_000 }), truncate: fc.boolean(), a: as }).map(({ n, truncate, a }) => ({ body: encode({ inputs: 'word '.repeat(n / 5), query: 'q', texts: ['x'.repeat(n)], truncate, model: 'tiny-embed', input: 'y '.repeat(n / 2) }, a), as: a })),
      fc.record({ n: fc.integer({ min: 9, max: 5_000 }), a: as }).map(({ n, a }) => ({ body: encode({ inputs: Array(n).fill('a'), texts: Array(n).fill('t'), query: 'q', ids: Array(n).fill([101, 102]), input: Array(n).fill('a') }, a), as: a })),
      fc.record({ n: fc.integer({ min: 1_000, max: 10_000 }), a: as }).map(({ n, a }) => ({ body: encode({ inputs: 'x', ...Object.fromEntries(Array.from({ length: n }, (_, k) => [`k${k}`, k])) }, a), as: a })),
    );
    await live();
    await check('http deep and huge', httpCase(bodies), 40, (c) => fuzzRoutes(server, c, tally), server);
  });

  it('every odd number in every numeric field, and nesting 40 000 deep in every field (enumerated, not drawn)', { timeout: 90_000 }, async () => {
    const bodies: { what: string; body: Uint8Array; as: 'json' | 'msgpack' }[] = [];
    hugeTemplates.forEach((t, i) => hugeNumberTexts.forEach((n) => bodies.push({ what: `JSON template ${i} with ${n.slice(0, 24)}`, body: Buffer.from(t(n)), as: 'json' })));
    msgpackNumberTemplates.forEach((t, i) => msgpackNumbers.forEach((n) => bodies.push({ what: `msgpack template ${i} with ${Buffer.from(n).toString('hex')}`, body: msgpackWithNumber(t, n), as: 'msgpack' })));
    deepTemplates.forEach((t, i) =>
      ([40_000] as const).forEach((depth) =>
        (['array', 'object'] as const).forEach((kind) => (['json', 'msgpack'] as const).forEach((a) => bodies.push({ what: `deep template ${i}, ${depth} ${kind}s, ${a}`, body: deepBody(t, depth, kind, a), as: a }))),
      ),
    );
    await live();
    const problems: string[] = [];
    let sent = 0;
    for (const b of bodies) {
      const c: HttpCase = { body: b.body, contentType: b.as === 'json' ? 'application/json' : 'application/msgpack', accept: undefined, deadlineHeader: undefined, priorityHeader: undefined, model: 'tiny-embed', version: '1' };
      // One route per handler (the /models/{name}/... and /versions/1/ forms share them; the drawn cases cover those).
      const routes = routesFor('tiny-embed', '1').filter((r) => !r.path.startsWith('/models/') && !r.path.includes('/versions/'));
      const replies = await Promise.all(routes.map((r) => post(server.url, r, c)));
      sent += replies.length;
      replies.forEach((reply, i) => {
        tally.set(String(reply.status), (tally.get(String(reply.status)) ?? 0) + 1);
        const p = judge(routes[i]!, c, reply);
        if (p) problems.push(`${b.what}: POST ${routes[i]!.path} -> ${reply.status}: ${p}`);
      });
      server.assertAlive();
    }
    console.log(`fuzz http enumerated: ${bodies.length} bodies, ${sent} requests`);
    expect(problems.slice(0, 30)).toEqual([]);
  });

  it('afterwards: alive, answers correctly, no slot in use, nothing queued, no thread error', { timeout: 60_000 }, async () => {
    expect(deaths, 'the server process died during the fuzz').toEqual([]);
    const r = await fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: 'still serving after the fuzz' }) });
    expect(r.status).toBe(200);
    const [row] = (await r.json()) as number[][];
    const { ids, typeIds } = await tokenizeOnServer(server, 'still serving after the fuzz');
    expect(maxAbsDiff(row!, (await embedRef.row(ids, typeIds)).slice(0, row!.length))).toBeLessThan(1e-5);
    await server.expectHealthy(MODELS);
  });
});

/** Token ids of `text` as the server's tokenizer makes them (POST /tokenize), for the reference. */
async function tokenizeOnServer(server: ChildServer, text: string): Promise<{ ids: number[]; typeIds: number[] }> {
  const r = await fetch(`${server.url}/models/tiny-embed/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ inputs: text }) });
  const [tokens] = (await r.json()) as { id: number }[][];
  const ids = tokens!.map((t) => t.id);
  return { ids, typeIds: ids.map(() => 0) };
}

// =================================================================== raw HTTP framing

interface RawOutcome {
  data: Buffer;
  closed: boolean;
}

/** Writes `chunks` on a fresh connection, then half-closes (or waits a little first); resolves when the server closes or stops talking. */
function rawExchange(port: number, chunks: Buffer[], waitBeforeFin: boolean): Promise<RawOutcome> {
  return new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1');
    let data = Buffer.alloc(0);
    let done = false;
    const finish = (closed: boolean) => {
      if (done) return;
      done = true;
      clearTimeout(limit);
      s.destroy();
      resolve({ data, closed });
    };
    // The server must close (or answer and close) within this once we have half-closed.
    const limit = setTimeout(() => finish(false), 8_000);
    s.on('data', (d: Buffer) => (data = Buffer.concat([data, d])));
    s.on('close', () => finish(true));
    s.on('error', () => finish(true));
    s.on('connect', async () => {
      try {
        for (const c of chunks) {
          if (s.destroyed) return;
          s.write(c);
          await new Promise((r) => setImmediate(r));
        }
        // Give the server a moment to answer before half-closing (uWS closes at once on FIN).
        for (let t = 0; waitBeforeFin && t < 30 && !s.destroyed && !hasResponse(data); t++) await sleep(5);
        if (!s.destroyed) s.end();
      } catch (err) {
        reject(err);
      }
    });
  });
}

const hasResponse = (data: Buffer) => {
  const r = responseStatuses(data);
  return Array.isArray(r) && r.length > 0;
};

/** Status codes of every HTTP response at the start of `data`, or a problem. */
function responseStatuses(data: Buffer): { status: number; ours: boolean }[] | string {
  const statuses: { status: number; ours: boolean }[] = [];
  let rest = data;
  while (rest.length > 0) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) return `an incomplete response head: ${JSON.stringify(rest.toString('latin1').slice(0, 200))}`;
    const head = rest.subarray(0, end).toString('latin1');
    const m = /^HTTP\/1\.1 (\d{3})(?: [^\r\n]*)?\r\n/.exec(head + '\r\n');
    if (!m) return `not an HTTP/1.1 status line: ${JSON.stringify(head.slice(0, 200))}`;
    // An interim 1xx (uWS answers `Expect: 100-continue` itself) has no body and comes before the real answer.
    if (m[1].startsWith('1')) {
      rest = rest.subarray(end + 4);
      continue;
    }
    // Ours carry a request id; uWS's own parser answers (20.57) are a status, Connection: close and an HTML page to the close.
    const ours = /\r\nx-request-id: /i.test(head);
    statuses.push({ status: Number(m[1]), ours });
    const cl = /\r\ncontent-length: *(\d+)/i.exec(head);
    const chunked = /\r\ntransfer-encoding: *chunked/i.test(head);
    if (!ours && !cl && !chunked && /\r\nconnection: *close/i.test(head)) break;
    if (chunked) {
      const term = rest.indexOf('0\r\n\r\n', end + 4);
      if (term < 0) return 'an incomplete chunked response';
      rest = rest.subarray(term + 5);
    } else {
      rest = rest.subarray(end + 4 + Number(cl?.[1] ?? 0));
    }
  }
  return statuses;
}

const crlf = fc.oneof({ weight: 8, arbitrary: fc.constant('\r\n') }, { weight: 1, arbitrary: fc.constantFrom('\n', '\r', '\r\r\n', '') });
const headerLine = fc.oneof(
  { weight: 12, arbitrary: fc.constantFrom('Accept: application/msgpack', 'Accept: */*', 'Connection: keep-alive', 'Connection: close', 'x-deadline-ms: 5000', 'x-priority: bulk', 'User-Agent: fuzz') },
  { weight: 2, arbitrary: fc.tuple(fc.string({ unit: 'binary-ascii', maxLength: 12 }), fc.string({ unit: 'binary-ascii', maxLength: 30 })).map(([k, v]) => `${k}: ${v}`) },
  { weight: 1, arbitrary: fc.string({ unit: 'binary-ascii', maxLength: 40 }) },
  { weight: 1, arbitrary: fc.constantFrom(' folded continuation', '\tobs-fold', ': no name', 'NoColon', 'Bad Name: x', 'x:\u0000y', 'Content-Length: -1', 'Content-Length: 1e3', 'Content-Length: 99999999999999999999', 'Content-Length: 5, 6', 'Content-Length: abc', 'Transfer-Encoding: chunked', 'Transfer-Encoding: gzip, chunked', 'Transfer-Encoding: chunked, identity', 'Transfer-Encoding: xchunked', 'Transfer-Encoding:\tchunked', 'Expect: 100-continue', 'Upgrade: websocket', 'Connection: Upgrade', 'Sec-WebSocket-Key: x', 'Sec-WebSocket-Version: 99') },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 20_000 }).map((n) => `X-Long: ${'v'.repeat(n)}`) },
  { weight: 1, arbitrary: fc.integer({ min: 0, max: 1000 }).map((n) => `Content-Length: ${n}`) },
);
const chunkPiece = fc.oneof(
  fc.string({ unit: 'grapheme-ascii', maxLength: 30 }).map((d) => `${d.length.toString(16)}\r\n${d}\r\n`),
  fc.tuple(fc.constantFrom('zz', '-1', 'ffffffffffffffff', '1;ext=1', '3 ', ' 3', '0x3', '', '7fffffff', '10000000000000000'), fc.string({ unit: 'binary-ascii', maxLength: 20 })).map(([size, d]) => `${size}\r\n${d}\r\n`),
  fc.constantFrom('0\r\n\r\n', '0\r\nTrailer: x\r\n\r\n', '0\r\n', '5\r\nab', '\r\n'),
);
/** Mostly `usual`, sometimes one of `odd`: most raw requests are nearly valid, so each oddity is met alone. */
const mostly = <T>(usual: fc.Arbitrary<T>, ...odd: fc.Arbitrary<T>[]) => fc.oneof({ weight: 6, arbitrary: usual }, ...odd.map((a) => ({ weight: 1, arbitrary: a })));
const rawRequest = fc.oneof(
  { weight: 1, arbitrary: fc.uint8Array({ maxLength: 600 }).map((b) => Buffer.from(b)) },
  {
    weight: 6,
    arbitrary: fc
      .record({
        method: mostly(fc.constantFrom('GET', 'POST'), fc.constantFrom('PUT', 'DELETE', 'HEAD', 'OPTIONS', 'PATCH', 'CONNECT', 'TRACE', 'PRI', 'get', ''), fc.string({ unit: 'binary-ascii', maxLength: 10 })),
        target: mostly(
          fc.constantFrom('/embed', '/predict', '/livez', '/metrics', '/tokenize', '/v1/embeddings', '/v2/models/tiny-embed/infer'),
          fc.constantFrom('/ws', '*', 'http://x/embed', '/embed?x=1', '/embed#f', '//embed', '/../embed', '/%00', '', '/embed%20', '/EMBED'),
          fc.string({ unit: 'binary-ascii', maxLength: 40 }).map((s) => '/' + s),
          fc.integer({ min: 1, max: 30_000 }).map((n) => '/' + 'a'.repeat(n)),
        ),
        version: mostly(fc.constant('HTTP/1.1'), fc.constantFrom('HTTP/1.0', 'HTTP/2.0', 'HTTP/9.9', 'HTTP/1.1x', 'http/1.1', '', 'HTTP/', 'HTTP/1.1 extra')),
        headers: fc.array(headerLine, { maxLength: 3 }),
        eol: crlf,
        body: fc.oneof(
          fc.constantFrom('', '{"inputs":"hello"}', '{"inputs":["a","b"]}', '{"inputs":', '{"inputs":"a"}{"inputs":"b"}'),
          fc.string({ unit: 'binary-ascii', maxLength: 100 }),
          fc.array(chunkPiece, { maxLength: 4 }).map((cs) => cs.join('')),
        ),
        length: fc.constantFrom('exact', 'exact', 'none', 'short', 'long', 'chunked'),
        pipelined: fc.option(fc.constantFrom('GET /livez HTTP/1.1\r\nHost: x\r\n\r\n', 'POST /embed HTTP/1.1\r\nContent-Length: 18\r\n\r\n{"inputs":"hello"}', 'GARBAGE\r\n\r\n'), { freq: 4 }),
      })
      .map(({ method, target, version, headers, eol, body, length, pipelined }) => {
        const framing =
          length === 'exact' ? [`Content-Length: ${Buffer.byteLength(body, 'latin1')}`]
          : length === 'short' ? [`Content-Length: ${Math.max(0, body.length - 3)}`]
          : length === 'long' ? [`Content-Length: ${body.length + 7}`]
          : length === 'chunked' ? ['Transfer-Encoding: chunked']
          : [];
        const head = ['Host: 127.0.0.1', 'Content-Type: application/json', ...framing, ...headers];
        return Buffer.from(`${method} ${target} ${version}${eol}${head.map((h) => h + eol).join('')}${eol}${body}${pipelined ?? ''}`, 'latin1');
      }),
  },
);

describe('fuzz: raw HTTP framing', () => {
  let server: ChildServer;
  const seen = new Map<string, number>();

  beforeAll(async () => {
    server = await ChildServer.start('fuzz-raw-http', testServerConfig({ models: ['tiny-embed'], maxBodyBytes: 64 * 1024, batching: { maxBatchTokens: 2048 } }));
  });

  afterAll(async () => {
    console.log(`fuzz raw http: outcomes ${JSON.stringify(Object.fromEntries([...seen].sort()))}`);
    await server?.stop();
  });

  it('garbage request lines, headers and chunked bodies get a clean non-5xx answer or a close; the server keeps serving others', { timeout: 90_000 }, async () => {
    const cases = fc.record({ req: rawRequest, splits: fc.array(fc.nat(), { maxLength: 3 }), waitBeforeFin: fc.constantFrom(true, true, true, false) });
    let n = 0;
    await check(
      'raw http',
      cases,
      150,
      async ({ req, splits, waitBeforeFin }) => {
        const cuts = [...new Set(splits.map((s) => s % (req.length + 1)))].sort((a, b) => a - b);
        const chunks = [0, ...cuts].map((at, i, all) => req.subarray(at, all[i + 1] ?? req.length)).filter((c) => c.length > 0);
        const out = await rawExchange(server.port, chunks, waitBeforeFin);
        if (!out.closed) throw new Error(`the server neither answered and closed nor closed within 8 s of our FIN (got ${out.data.length} bytes)`);
        const statuses = out.data.length ? responseStatuses(out.data) : [];
        if (typeof statuses === 'string') throw new Error(statuses);
        // Ours never a 5xx; uWS's own parser (20.57) refuses what it cannot parse with 400, 431 or 505.
        const bad = statuses.filter((s) => (s.ours ? s.status >= 500 : !(NEWER_UWS && [400, 431, 505].includes(s.status))));
        if (bad.length) throw new Error(`server error status ${bad.map((s) => `${s.status}${s.ours ? '' : ' (uWS)'}`).join(',')}: ${out.data.toString('latin1').slice(0, 300)}`);
        const key = statuses.length ? statuses.map((s) => `${s.status}${s.ours ? '' : '-uws'}`).join('+') : 'closed';
        seen.set(key, (seen.get(key) ?? 0) + 1);
        // Another client is served meanwhile (every few cases: a full request on its own connection).
        if (n++ % 5 === 0) {
          const r = await fetch(`${server.url}/embed`, { method: 'POST', headers: { 'content-type': 'application/json', connection: 'close' }, body: '{"inputs":"bystander"}', signal: AbortSignal.timeout(CLIENT_TIMEOUT_MS) });
          if (r.status !== 200) throw new Error(`a well-formed request on another connection got ${r.status}`);
        }
      },
      server,
    );
    await server.expectHealthy(['tiny-embed']);
  });

  it('Expect: 100-continue gets the interim 100 Continue, then the real answer', async () => {
    const body = '{"inputs":"hello"}';
    const req = `POST /embed HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nExpect: 100-continue\r\n\r\n${body}`;
    const out = await rawExchange(server.port, [Buffer.from(req, 'latin1')], true);
    const text = out.data.toString('latin1');
    expect(text.startsWith('HTTP/1.1 100 Continue\r\n\r\n'), text.slice(0, 200)).toBe(true);
    expect(responseStatuses(out.data)).toEqual([{ status: 200, ours: true }]);
  });
});

// =================================================================== WebSocket

type Frame = Record<string, unknown>;
const DEEP_ID = 'deep-frame';

class WsClient {
  readonly frames: unknown[] = [];
  readonly textFrames: string[] = [];
  closed: { code: number; reason: string } | null = null;
  private waiters: (() => void)[] = [];

  private constructor(readonly ws: WebSocket) {
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (isBinary) {
        try {
          this.frames.push(unpack(data));
        } catch (err) {
          this.frames.push({ __undecodable: `${(err as Error).message}: ${data.subarray(0, 60).toString('hex')}` });
        }
      } else this.textFrames.push(data.toString('utf8'));
      this.wake();
    });
    ws.on('close', (code: number, reason: Buffer) => {
      this.closed = { code, reason: reason.toString('utf8') };
      this.wake();
    });
    ws.on('error', () => {});
  }

  static open(port: number): Promise<WsClient> {
    return new Promise((resolve, reject) => {
      const ws = new WebSocket(`ws://127.0.0.1:${port}/ws`, { maxPayload: 64 * 1024 * 1024 });
      ws.once('open', () => resolve(new WsClient(ws)));
      ws.once('error', reject);
    });
  }

  private wake(): void {
    for (const w of this.waiters.splice(0)) w();
  }

  async until(what: string, done: () => boolean, timeoutMs = CLIENT_TIMEOUT_MS): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    while (!done()) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`ws: no ${what} within ${timeoutMs} ms (a hang); ${this.frames.length} frames, closed ${JSON.stringify(this.closed)}`);
      await new Promise<void>((r) => {
        const t = setTimeout(r, Math.min(left, 200));
        this.waiters.push(() => {
          clearTimeout(t);
          r();
        });
      });
    }
  }

  answers(id: unknown): Frame[] {
    return this.frames.filter((f): f is Frame => isObject(f) && 'id' in f && sameId(f.id, id));
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.ws.close(1000);
    await this.until('close', () => this.closed !== null, 5_000).catch(() => this.ws.terminate());
  }
}

/** Ids as a Map compares them (SameValueZero: NaN is NaN, -0 is 0). */
const sameId = (a: unknown, b: unknown) => a === b || (Number.isNaN(a) && Number.isNaN(b));

const WS_ERROR_TYPES = new Set(['validation', 'too_long', 'not_found', 'overloaded', 'timeout', 'unavailable', 'backend', 'cancelled']);

/** What is wrong with a server frame, or null. */
function judgeWsFrame(f: unknown): string | null {
  if (!isObject(f)) return `not an object: ${show(f)}`;
  if ('__undecodable' in f) return `undecodable frame ${f.__undecodable}`;
  if (f.op === 'hello') {
    return keys(f) === 'credit,max_client_batch_size,max_frame_bytes,op,version' && Number.isInteger(f.credit) && (f.credit as number) >= 1 ? null : `bad hello answer ${show(f)}`;
  }
  if (!('id' in f) || !(f.id === null || typeof f.id === 'string' || typeof f.id === 'number')) return `answer without an id: ${show(f)}`;
  if ('result' in f) return keys(f) === 'id,result' && allFinite(f.result) ? null : `bad result frame ${show(f)}`;
  const e = f.error;
  if (keys(f) !== 'error,id' || !isObject(e) || keys(e) !== 'code,message,type') return `bad error frame ${show(f)}`;
  if (!WS_ERROR_TYPES.has(e.type as string) || typeof e.code !== 'string' || typeof e.message !== 'string' || !e.message) return `bad error fields ${show(f)}`;
  return null;
}

const wsId = fc.oneof({ weight: 4, arbitrary: fc.integer({ min: 0, max: 6 }) }, { weight: 3, arbitrary: fc.constantFrom('a', 'b', '', 'x y') }, { weight: 2, arbitrary: anyString(8) }, { weight: 1, arbitrary: wrong });
const wsOp = fc.record(
  {
    id: wsId,
    op: fc.oneof(
      { weight: 8, arbitrary: fc.constantFrom('embed', 'predict', 'rerank', 'tokenize', 'decode', 'cancel', 'hello') },
      { weight: 1, arbitrary: fc.constantFrom('toString', '__proto__', 'constructor', 'hasOwnProperty', '', 'EMBED') },
      { weight: 1, arbitrary: wrong },
    ),
    inputs: field(inputs),
    query: field(text),
    texts: field(fc.array(text, { maxLength: MAX_INPUTS + 2 })),
    ids: field(fc.oneof(tokenIds, fc.array(tokenIds, { maxLength: 3 }))),
    model: field(modelName),
    normalize: field(fc.boolean()),
    truncate: field(fc.boolean()),
    raw_scores: field(fc.boolean()),
    return_text: field(fc.boolean()),
    add_special_tokens: field(fc.boolean()),
    skip_special_tokens: field(fc.boolean()),
    encoding: field(fc.constant('f32')),
    deadline_ms: field(fc.oneof(fc.integer({ min: 0, max: 60_000 }), fc.double({ min: 0, max: 5 }))),
    priority: field(fc.constantFrom('interactive', 'bulk', 'nope')),
    credit: field(fc.integer({ min: 1, max: 300 })),
  },
  { requiredKeys: ['op'] },
);
type WsSend = { kind: 'binary'; data: Uint8Array } | { kind: 'text'; data: string };
const wsFrame: fc.Arbitrary<WsSend> = fc.oneof(
  { weight: 2, arbitrary: fc.uint8Array({ maxLength: 200 }).map((data) => ({ kind: 'binary' as const, data })) },
  { weight: 1, arbitrary: anyString(40).map((data) => ({ kind: 'text' as const, data })) },
  { weight: 2, arbitrary: anything.map((v) => ({ kind: 'binary' as const, data: toMsgpack(v) })) },
  { weight: 8, arbitrary: wsOp.map((v) => ({ kind: 'binary' as const, data: toMsgpack(v) })) },
  { weight: 1, arbitrary: fc.tuple(wsOp, fc.array(mutation, { minLength: 1, maxLength: 3 })).map(([v, m]) => ({ kind: 'binary' as const, data: mutate(toMsgpack(v), m) })) },
  // Its id is fixed: this side may fail to decode what the server decodes (their stacks differ), and must still know the id.
  { weight: 1, arbitrary: fc.record({ depth: fc.integer({ min: 100, max: 20_000 }), kind: fc.constantFrom('array' as const, 'object' as const) }).map(({ depth, kind }) => ({ kind: 'binary' as const, data: deepBody({ id: DEEP_ID, op: '__DEEP__' }, depth, kind, 'msgpack') })) },
  { weight: 1, arbitrary: fc.constantFrom(...msgpackNumberTemplates.map((t) => ({ ...(t as object), id: 9, op: 'embed' }))).chain((t) => fc.constantFrom(...msgpackNumbers).map((n) => ({ kind: 'binary' as const, data: msgpackWithNumber(t, n) }))) },
  { weight: 1, arbitrary: fc.constantFrom(...msgpackNumbers).map((n) => ({ kind: 'binary' as const, data: msgpackWithNumber({ id: 3, op: '__N__' }, n) })) },
  // Over --ws-max-frame-bytes (1009), and over twice it (uWS drops the connection: 1006).
  { weight: 1, arbitrary: fc.constantFrom(WS_MAX_FRAME + 1, 2 * WS_MAX_FRAME + 100).map((n) => ({ kind: 'binary' as const, data: pack({ id: 'big', op: 'embed', inputs: 'x'.repeat(n) }) })) },
);

describe('fuzz: WebSocket decoder', () => {
  let server: ChildServer;
  let bystander: WsClient;
  let embedRef: Reference;
  let bystanderRow: Float32Array;

  const deaths: string[] = [];
  const start = () =>
    ChildServer.start('fuzz-ws', testServerConfig({ models: [...MODELS], maxClientBatchSize: MAX_INPUTS, maxBodyBytes: MAX_BODY, wsMaxFrameBytes: WS_MAX_FRAME, batching: { maxBatchTokens: 2048 } }));
  /** The server (and the bystander socket), restarted if an earlier test killed it. */
  const live = async (): Promise<void> => {
    if (server.alive) return;
    deaths.push(server.describeDeath());
    bystander.ws.terminate();
    server = await start();
    bystander = await WsClient.open(server.port);
  };

  beforeAll(async () => {
    embedRef = await Reference.open('tiny-embed');
    words = vocabularyWords(embedRef.spec).slice(0, 2000);
    server = await start();
    bystander = await WsClient.open(server.port);
    const { ids, typeIds } = await tokenizeOnServer(server, 'the bystander socket');
    bystanderRow = (await embedRef.row(ids, typeIds)).slice(0, 128);
  });

  afterAll(async () => {
    bystander?.ws.terminate();
    await server?.stop();
    await embedRef?.close();
  });

  let bystanderCalls = 0;
  async function bystanderServed(): Promise<void> {
    const id = `bystander-${bystanderCalls++}`;
    bystander.ws.send(pack({ id, op: 'embed', inputs: 'the bystander socket' }));
    await bystander.until(`an answer on the bystander socket`, () => bystander.answers(id).length > 0 || bystander.closed !== null);
    const [f] = bystander.answers(id);
    if (!f || !Array.isArray(f.result)) throw new Error(`the bystander socket got ${show(f ?? bystander.closed)}`);
    const d = maxAbsDiff(f.result[0] as number[], bystanderRow);
    if (!(d < 1e-5)) throw new Error(`the bystander's embedding is off by ${d}`);
  }

  it('random frames, msgpack of anything, wrong op shapes: well-formed answers, each request once; the socket and a bystander keep serving', { timeout: 90_000 }, async () => {
    await live();
    const closes = new Map<string, number>();
    let framesSent = 0;
    await check(
      'ws frames',
      fc.array(wsFrame, { minLength: 1, maxLength: 8 }),
      100,
      async (frames) => {
        const c = await WsClient.open(server.port);
        try {
          const sent: unknown[] = [];
          let oversized = false;
          for (const f of frames) {
            framesSent++;
            if (f.kind === 'text') c.ws.send(f.data, { binary: false });
            else {
              c.ws.send(f.data, { binary: true });
              if (f.data.length > WS_MAX_FRAME) oversized = true;
              try {
                sent.push(unpack(f.data));
              } catch (err) {
                // Too deep for this thread's stack, maybe not for the server's (answered with its id, or with
                // null if too deep there too): the only such frames carry DEEP_ID, left out of the exactly-once check.
                sent.push(err instanceof RangeError ? { id: DEEP_ID, op: 'deep' } : undefined);
              }
            }
          }
          const probe = `probe-${Math.random().toString(36).slice(2)}`;
          c.ws.send(pack({ id: probe, op: 'tokenize', inputs: 'probe' }));
          await c.until('answer to the probe', () => c.answers(probe).length > 0 || c.closed !== null);
          if (c.closed) {
            const key = `closed ${c.closed.code}`;
            closes.set(key, (closes.get(key) ?? 0) + 1);
            if (!oversized) {
              await Promise.race([server.exited, sleep(500)]);
              server.assertAlive();
              throw new Error(`the server closed the socket (${c.closed.code} ${c.closed.reason}) though no frame was over the limit`);
            }
            if (c.closed.code !== 1009 && c.closed.code !== 1006) throw new Error(`an oversized frame closed the socket with ${c.closed.code}, expected 1009 (or 1006 past twice the limit)`);
          } else {
            // Each request with an id unique in this run is answered exactly once (hello and cancel are not requests).
            const ids = sent.filter((m): m is Frame => isObject(m) && (typeof m.id === 'string' || typeof m.id === 'number')).map((m) => m.id);
            const unique = sent.filter(
              (m): m is Frame =>
                isObject(m) && m.op !== 'hello' && m.op !== 'cancel' && (typeof m.id === 'string' || typeof m.id === 'number') && m.id !== DEEP_ID && ids.filter((x) => sameId(x, m.id)).length === 1,
            );
            for (const m of unique) {
              await c.until(`an answer to ${show(m.id)}`, () => c.answers(m.id).length > 0 || c.closed !== null);
            }
            await sleep(5); // a second answer, if the server sent one, would be here by now
            for (const m of unique) {
              const n = c.answers(m.id).length;
              if (n !== 1) throw new Error(`request ${show(m)} was answered ${n} times`);
            }
            const p = c.answers(probe)[0]!;
            if (!('result' in p) && (p.error as { type?: string }).type !== 'overloaded') throw new Error(`the probe got ${show(p)}`);
            closes.set('open', (closes.get('open') ?? 0) + 1);
          }
          for (const f of c.frames) {
            const problem = judgeWsFrame(f);
            if (problem) throw new Error(problem);
          }
          if (c.textFrames.length) throw new Error(`the server sent text frames: ${c.textFrames.slice(0, 2).join(' | ')}`);
        } finally {
          await c.close();
        }
        await bystanderServed();
      },
      server,
    );
    console.log(`fuzz ws: ${framesSent} frames; sockets ${JSON.stringify(Object.fromEntries(closes))}`);
  });

  it('raw WebSocket framing garbage after a real upgrade: a close at worst; the bystander keeps serving', { timeout: 90_000 }, async () => {
    const frameBytes = fc.oneof(
      fc.uint8Array({ maxLength: 300 }).map((b) => Buffer.from(b)),
      fc
        .record({
          fin: fc.boolean(),
          rsv: fc.integer({ min: 0, max: 7 }),
          opcode: fc.integer({ min: 0, max: 15 }),
          masked: fc.boolean(),
          lenKind: fc.constantFrom('exact', 'short', 'long', 'huge16', 'huge64'),
          payload: fc.uint8Array({ maxLength: 200 }),
          mask: fc.uint8Array({ minLength: 4, maxLength: 4 }),
        })
        .map(({ fin, rsv, opcode, masked, lenKind, payload, mask }) => {
          const len = lenKind === 'exact' ? payload.length : lenKind === 'short' ? payload.length + 10 : lenKind === 'long' ? Math.max(0, payload.length - 5) : lenKind === 'huge16' ? 65_535 : 2 ** 40;
          const head = [((fin ? 1 : 0) << 7) | (rsv << 4) | opcode];
          const m = masked ? 0x80 : 0;
          if (len < 126) head.push(m | len);
          else if (len < 65_536) head.push(m | 126, len >> 8, len & 0xff);
          else head.push(m | 127, 0, 0, Math.floor(len / 2 ** 32) >> 8, Math.floor(len / 2 ** 32) & 0xff, 0, 0, 0, 0);
          const body = Buffer.from(payload);
          if (masked) for (let i = 0; i < body.length; i++) body[i]! ^= mask[i % 4]!;
          return Buffer.concat([Buffer.from(head), masked ? Buffer.from(mask) : Buffer.alloc(0), body]);
        }),
      fc.constantFrom(
        Buffer.from([0x88, 0x82, 0, 0, 0, 0, 0x03, 0xe7]), // close with code 999
        Buffer.from([0x88, 0x81, 0, 0, 0, 0, 0x03]), // close with a 1-byte payload
        Buffer.from([0x89, 0xfe, 0x00, 0x80, 0, 0, 0, 0]), // ping longer than 125
        Buffer.from([0x09, 0x80, 0, 0, 0, 0]), // fragmented ping
        Buffer.from([0x80, 0x80, 0, 0, 0, 0]), // continuation with nothing to continue
        Buffer.from([0x81, 0x82, 0, 0, 0, 0, 0xc3, 0x28]), // text frame of invalid UTF-8
      ),
    );
    await live();
    let n = 0;
    await check(
      'raw ws',
      fc.array(frameBytes, { minLength: 1, maxLength: 4 }),
      50,
      async (frames) => {
        const s = net.connect(server.port, '127.0.0.1');
        let data = Buffer.alloc(0);
        let closed = false;
        s.on('data', (d: Buffer) => (data = Buffer.concat([data, d])));
        const gone = new Promise<void>((r) => s.on('close', () => ((closed = true), r())));
        s.on('error', () => {});
        try {
          await new Promise<void>((r, j) => (s.once('connect', r), s.once('error', j)));
          s.write('GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n');
          const t0 = Date.now();
          while (!data.includes('\r\n\r\n') && !closed && Date.now() - t0 < 10_000) await sleep(5);
          if (!data.toString('latin1').startsWith('HTTP/1.1 101')) throw new Error(`no 101 to the upgrade: ${JSON.stringify(data.toString('latin1').slice(0, 100))}`);
          for (const f of frames) if (!closed) s.write(f);
          await sleep(20);
          s.end();
          await Promise.race([gone, sleep(8_000)]);
          if (!closed) throw new Error('the server did not close the socket within 8 s of our FIN');
        } finally {
          s.destroy();
        }
        if (n++ % 3 === 0) await bystanderServed();
      },
      server,
    );
    await bystanderServed();
  });

  it('afterwards: alive, no slot in use, nothing queued, no thread error', { timeout: 60_000 }, async () => {
    expect(deaths, 'the server process died during the fuzz').toEqual([]);
    await bystanderServed();
    await server.expectHealthy(MODELS);
  });
});

// =================================================================== slot state machine

/** The row the controlled runner writes for a slot: a function of the slot's own ids (tag first). */
function expectedRow(ids: ArrayLike<number>, len: number): Float32Array {
  let sum = 0;
  let weighted = 0;
  for (let i = 0; i < len; i++) {
    sum += ids[i]!;
    weighted = (weighted + (i + 1) * ids[i]!) % 65_521;
  }
  return Float32Array.of(ids[0]!, sum, weighted + len * 1e-3);
}

interface Batch {
  slots: number[];
  tags: number[];
  outcome: 'pending' | 'ok' | 'failed';
  resolve: () => void;
  reject: (e: Error) => void;
}

type Settled = { kind: 'ok'; res: SlotResult } | { kind: 'err'; err: unknown };
interface Req {
  tag: number;
  ids: number[];
  deadline: 'far' | 'past' | 'soon';
  ac: AbortController | null;
  abortedAt: 'never' | 'before-submit' | 'later';
  /** Every slot was taken when it was submitted. */
  noSlot: boolean;
  settled: Settled[];
}

/** The real SlabSubmitter and InferenceLoop on this thread, over one real slab, with a runner the commands drive. */
class SlotRig {
  readonly slab: Slab;
  readonly control = ControlBlock.create(1);
  readonly sub: SlabSubmitter;
  readonly loop: InferenceLoop;
  readonly loopDone: Promise<void>;
  readonly batches: Batch[] = [];
  readonly reqs: Req[] = [];
  readonly ran = new Map<number, number>();
  readonly violations: string[] = [];
  acquires = 0;
  private snapshotting = false;

  constructor(readonly slots: number, maxBatchSize: number, maxInflight: number) {
    current = this;
    this.slab = Slab.create({ slotCount: slots, maxLength: 16, outputWidth: 3, owners: 1 });
    // Acquisitions counted where they happen: every slot taken off the free list (by the submitter;
    // the loop only pushes onto it), except this test's own snapshots.
    const free = this.slab.free;
    const pop = free.pop.bind(free);
    free.pop = () => {
      const v = pop();
      if (v !== -1 && !this.snapshotting) this.acquires++;
      return v;
    };
    this.sub = new SlabSubmitter([this.slab], this.control, 0);
    const options: BatchingOptions = { maxBatchSize, maxBatchDelayMs: 0, maxBatchTokens: 1024, buckets: [8, 16], padTo: 'bucket' };
    const runner: LoopRunner = {
      spec: { name: 'model-under-test' } as LoopRunner['spec'],
      slab: this.slab,
      options: options as LoopRunner['options'],
      run: (slots: number[], bucket: number) => this.run(slots, bucket),
    };
    this.loop = new InferenceLoop([runner], this.control, { maxInflightBatches: maxInflight, onBatchError: () => {} });
    this.loopDone = this.loop.run();
  }

  private run(slots: number[], bucket: number): ReturnType<LoopRunner['run']> {
    const tags = slots.map((s) => {
      const st = this.slab.state(s);
      if (st !== SlotState.RUNNING && st !== SlotState.CANCELLED) this.violations.push(`slot ${s} handed to run() in state ${st}`);
      const tag = this.slab.slotIds(s)[0]!;
      this.ran.set(tag, (this.ran.get(tag) ?? 0) + 1);
      return tag;
    });
    const inputs = slots.map((s) => ({ s, len: this.slab.header(s, H_LENGTH), ids: this.slab.slotIds(s).slice() }));
    return new Promise((resolve, reject) => {
      const batch: Batch = {
        slots,
        tags,
        outcome: 'pending',
        resolve: () => {
          batch.outcome = 'ok';
          for (const { s, len, ids } of inputs) this.slab.slotOutput(s).set(expectedRow(ids, len));
          resolve({ rows: slots.length, realTokens: inputs.reduce((a, i) => a + i.len, 0), paddedTokens: slots.length * [8, 16][bucket]!, runMs: 0 });
        },
        reject: (e) => {
          batch.outcome = 'failed';
          reject(e);
        },
      };
      this.batches.push(batch);
    });
  }

  pendingBatches(): Batch[] {
    return this.batches.filter((b) => b.outcome === 'pending');
  }

  submit(len: number, deadline: Req['deadline'], signal: 'none' | 'signal' | 'pre-aborted'): void {
    const tag = 1_000 + this.reqs.length;
    const ids = [tag, ...Array.from({ length: len - 1 }, (_, i) => (tag * 7 + i * 13) % 997)];
    const ac = signal === 'none' ? null : new AbortController();
    if (signal === 'pre-aborted') ac!.abort('ws_cancel');
    const req: Req = { tag, ids, deadline, ac, abortedAt: signal === 'pre-aborted' ? 'before-submit' : 'never', noSlot: this.slab.free.size() === 0, settled: [] };
    this.reqs.push(req);
    const at = deadline === 'far' ? Date.now() + 60_000 : deadline === 'past' ? Date.now() - 1_000 : Date.now() + 2;
    this.sub.submit(0, ids, null, { deadline: at, ...(ac ? { signal: ac.signal } : {}) }).then(
      (res) => req.settled.push({ kind: 'ok', res }),
      (err: unknown) => req.settled.push({ kind: 'err', err }),
    );
  }

  generations(): number {
    let g = 0;
    for (let s = 0; s < this.slots; s++) g += Atomics.load(this.slab.headers, s * HEADER_I32 + H_GENERATION);
    return g;
  }

  /** Pops every value of a queue and pushes them back in order (this thread is the only one using it). */
  private snapshot(q: Slab['free']): number[] {
    const out: number[] = [];
    this.snapshotting = true;
    try {
      for (let v = q.pop(); v !== -1; v = q.pop()) out.push(v);
      for (const v of out) if (!q.push(v)) throw new Error('could not push a value back');
    } finally {
      this.snapshotting = false;
    }
    return out;
  }

  /** The slab's invariants, on a consistent snapshot (everything runs on this thread). */
  invariants(where: string): void {
    const fail = (m: string) => {
      throw new Error(`${where}: ${m}`);
    };
    if (this.violations.length) fail(this.violations.join('; '));
    const states = Array.from({ length: this.slots }, (_, s) => this.slab.state(s));
    const free = this.snapshot(this.slab.free);
    const submitted = this.snapshot(this.slab.submit);
    const completed = this.snapshot(this.slab.completions[0]!);
    const dup = (xs: number[]) => xs.length !== new Set(xs).size;
    if (dup(free)) fail(`duplicates on the free list: [${free}]`);
    if (dup(submitted)) fail(`duplicates in the submit ring: [${submitted}]`);
    if (dup(completed)) fail(`duplicates in the completion queue: [${completed}]`);
    for (const s of free) if (states[s] !== SlotState.FREE) fail(`slot ${s} on the free list in state ${states[s]}`);
    const freeStates = states.filter((st) => st === SlotState.FREE).length;
    if (freeStates !== free.length) fail(`${freeStates} slots FREE but ${free.length} on the free list (states [${states}], free [${free}])`);
    for (const s of submitted) if (states[s] !== SlotState.QUEUED && states[s] !== SlotState.CANCELLED) fail(`slot ${s} in the submit ring in state ${states[s]}`);
    for (const s of completed) if (states[s] !== SlotState.DONE && states[s] !== SlotState.FAILED) fail(`slot ${s} in the completion queue in state ${states[s]}`);
    for (const s of submitted) if (free.includes(s) || completed.includes(s)) fail(`slot ${s} in two queues`);
    for (const s of completed) if (free.includes(s)) fail(`slot ${s} in two queues`);
    if (this.slab.slotsInUse() !== this.slots - free.length) fail(`slotsInUse ${this.slab.slotsInUse()} with ${free.length} free of ${this.slots}`);
    if (this.generations() !== this.acquires) fail(`generations sum to ${this.generations()} after ${this.acquires} acquisitions`);
    for (const r of this.reqs) if (r.settled.length > 1) fail(`request ${r.tag} settled ${r.settled.length} times`);
    for (const [tag, n] of this.ran) if (n > 1) fail(`request ${tag} ran ${n} times`);
    const unsettled = this.reqs.filter((r) => r.settled.length === 0).length;
    if (this.sub.pendingCount !== unsettled) fail(`the submitter has ${this.sub.pendingCount} pending, ${unsettled} requests are unsettled`);
  }

  /** Each settled request's outcome agrees with what happened to it. */
  outcomes(where: string): void {
    const batchOf = (tag: number) => this.batches.find((b) => b.tags.includes(tag));
    for (const r of this.reqs) {
      const o = r.settled[0];
      if (!o) continue;
      const b = batchOf(r.tag);
      const fail = (m: string) => {
        throw new Error(`${where}: request ${r.tag} (deadline ${r.deadline}, aborted ${r.abortedAt}, batch ${b?.outcome ?? 'none'}): ${m}`);
      };
      if (o.kind === 'ok') {
        const want = expectedRow(r.ids, r.ids.length);
        if (!want.every((v, k) => Object.is(v, o.res.output[k]))) fail(`resolved with another row [${Array.from(o.res.output)}], its own is [${Array.from(want)}]`);
        if (b?.outcome !== 'ok') fail('resolved though its batch did not succeed');
        if (r.deadline === 'past') fail('resolved though its deadline had passed before it was submitted');
      } else if (o.err instanceof CancelledError) {
        if (r.abortedAt === 'never') fail('rejected as cancelled but never aborted');
      } else if (o.err instanceof InferenceError) {
        if (b?.outcome !== 'failed') fail('rejected as a failed batch though it was in none');
      } else if (o.err instanceof DeadlineExceededError) {
        if (r.deadline === 'far') fail('expired with a deadline a minute away');
        if (b) fail('expired after it ran');
      } else if (o.err instanceof OverloadedError) {
        if (!r.noSlot) fail('refused as overloaded while a slot was free');
      } else if (o.err instanceof EngineClosedError) {
        if (b) fail('failed at shutdown after it ran');
      } else fail(`rejected with ${String(o.err)}`);
    }
  }

  /** Finishes everything, stops the loop, and checks that every slot came back. */
  async finish(): Promise<void> {
    for (let round = 0; round < 200; round++) {
      for (const b of this.pendingBatches()) b.resolve();
      await turns(3);
      if (this.reqs.every((r) => r.settled.length > 0)) break;
    }
    this.invariants('before stop');
    this.control.requestStop();
    for (let round = 0; round < 200; round++) {
      for (const b of this.pendingBatches()) b.resolve();
      const done = await Promise.race([this.loopDone.then(() => true), turns(2).then(() => false)]);
      if (done) break;
    }
    await this.loopDone;
    await turns(3);
    this.invariants('after stop');
    this.outcomes('after stop');
    const unsettled = this.reqs.filter((r) => r.settled.length === 0).map((r) => r.tag);
    if (unsettled.length) throw new Error(`requests never settled: ${unsettled}`);
    if (this.slab.slotsInUse() !== 0) throw new Error(`${this.slab.slotsInUse()} slots still in use; states [${Array.from({ length: this.slots }, (_, s) => this.slab.state(s))}]`);
    for (const r of this.reqs) {
      const ran = this.ran.get(r.tag) ?? 0;
      if (r.abortedAt === 'before-submit' && ran) throw new Error(`request ${r.tag} ran though it was aborted before it was submitted`);
      if (r.deadline === 'past' && ran) throw new Error(`request ${r.tag} ran though its deadline had passed`);
    }
  }

  /** Stops the loop whatever state it is in (after a failure). */
  async dispose(): Promise<void> {
    this.control.requestStop();
    for (let round = 0; round < 100; round++) {
      for (const b of this.pendingBatches()) b.resolve();
      if (await Promise.race([this.loopDone.then(() => true), turns(2).then(() => false)])) return;
    }
  }
}

/** The rig of the run in progress: an error thrown in the loop's batch callbacks (an unhandled rejection) is its violation. */
let current: SlotRig | null = null;
const onUnhandled = (reason: unknown) => {
  if (current) current.violations.push(`unhandled rejection: ${String(reason)}`);
  else throw reason;
};

/** `n` turns of the event loop: the inference loop's doorbell wake-ups and the submitter's drain run in them. */
async function turns(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await new Promise<void>((r) => setImmediate(r));
}

type SlotModel = { submitted: number };
type SlotCommand = fc.AsyncCommand<SlotModel, SlotRig>;

/** Runs a command, then lets settlements land (microtasks) and checks the slab and the outcomes so far. */
async function thenCheck(rig: SlotRig, what: string, act: () => void | Promise<void>): Promise<void> {
  await act();
  await Promise.resolve();
  await new Promise<void>((r) => setImmediate(r));
  rig.invariants(`after ${what}`);
  rig.outcomes(`after ${what}`);
}

class SubmitCommand implements SlotCommand {
  constructor(
    readonly len: number,
    readonly deadline: Req['deadline'],
    readonly signal: 'none' | 'signal' | 'pre-aborted',
  ) {}
  check = () => true;
  async run(m: SlotModel, rig: SlotRig): Promise<void> {
    m.submitted++;
    await thenCheck(rig, this.toString(), () => rig.submit(this.len, this.deadline, this.signal));
  }
  toString = () => `submit(len ${this.len}, ${this.deadline}, ${this.signal})`;
}

class AbortCommand implements SlotCommand {
  constructor(readonly pick: number) {}
  check = (m: Readonly<SlotModel>) => m.submitted > 0;
  async run(_m: SlotModel, rig: SlotRig): Promise<void> {
    const open = rig.reqs.filter((r) => r.ac && !r.ac.signal.aborted);
    if (!open.length) return;
    const r = open[this.pick % open.length]!;
    await thenCheck(rig, this.toString(), () => {
      r.abortedAt = 'later';
      r.ac!.abort('ws_cancel');
    });
  }
  toString = () => `abort(#${this.pick})`;
}

class FinishBatchCommand implements SlotCommand {
  constructor(
    readonly pick: number,
    readonly ok: boolean,
  ) {}
  check = (m: Readonly<SlotModel>) => m.submitted > 0;
  async run(_m: SlotModel, rig: SlotRig): Promise<void> {
    const pending = rig.pendingBatches();
    if (!pending.length) return;
    const b = pending[this.pick % pending.length]!;
    await thenCheck(rig, this.toString(), () => (this.ok ? b.resolve() : b.reject(new Error('the device failed'))));
  }
  toString = () => `${this.ok ? 'complete' : 'fail'}Batch(#${this.pick})`;
}

class TurnsCommand implements SlotCommand {
  constructor(readonly n: number) {}
  check = () => true;
  async run(_m: SlotModel, rig: SlotRig): Promise<void> {
    await thenCheck(rig, this.toString(), () => turns(this.n));
  }
  toString = () => `turns(${this.n})`;
}

class SleepCommand implements SlotCommand {
  constructor(readonly ms: number) {}
  check = () => true;
  async run(_m: SlotModel, rig: SlotRig): Promise<void> {
    await thenCheck(rig, this.toString(), () => sleep(this.ms));
  }
  toString = () => `sleep(${this.ms} ms)`;
}

describe('fuzz: slot state machine (model-based, one thread)', () => {
  it('random interleavings of submit, cancel, run, complete, fail, expire and stop keep every slab invariant; every request settles once with its own row; every slot comes back', { timeout: 60_000 }, async () => {
    const submit = fc
      .record({
        len: fc.integer({ min: 1, max: 16 }),
        deadline: fc.constantFrom('far', 'far', 'far', 'past', 'soon') as fc.Arbitrary<Req['deadline']>,
        signal: fc.constantFrom('none', 'signal', 'signal', 'pre-aborted') as fc.Arbitrary<'none' | 'signal' | 'pre-aborted'>,
      })
      .map(({ len, deadline, signal }) => new SubmitCommand(len, deadline, signal));
    const commands = [
      submit,
      submit,
      submit,
      fc.nat().map((k) => new AbortCommand(k)),
      fc.tuple(fc.nat(), fc.boolean()).map(([k, ok]) => new FinishBatchCommand(k, ok)),
      fc.tuple(fc.nat(), fc.constant(true)).map(([k, ok]) => new FinishBatchCommand(k, ok)),
      fc.integer({ min: 1, max: 4 }).map((n) => new TurnsCommand(n)),
      fc.integer({ min: 1, max: 4 }).map((ms) => new SleepCommand(ms)),
    ];
    const tally = { requests: 0, batches: 0, ok: 0, cancelled: 0, failed: 0, expired: 0, overloaded: 0, closed: 0 };
    // At least 2 slots: an IndexQueue of capacity 1 cannot tell full from free (Vyukov's queue needs 2 cells),
    // so a double free there would not show as a duplicate but make the next pop spin forever.

    process.on('unhandledRejection', onUnhandled);
    onTestFinished(() => {
      process.off('unhandledRejection', onUnhandled);
      current = null;
    });
    await check(
      'slot state machine',
      fc.record({ slots: fc.integer({ min: 2, max: 6 }), maxBatchSize: fc.integer({ min: 1, max: 4 }), maxInflight: fc.integer({ min: 1, max: 2 }), cmds: fc.commands(commands, { maxCommands: 50, size: 'max' }) }),
      150,
      async ({ slots, maxBatchSize, maxInflight, cmds }) => {
        const rig = new SlotRig(slots, maxBatchSize, maxInflight);
        try {
          await fc.asyncModelRun(() => ({ model: { submitted: 0 }, real: rig }), cmds);
          await rig.finish();
        } catch (err) {
          await rig.dispose();
          throw err;
        }
        tally.requests += rig.reqs.length;
        tally.batches += rig.batches.length;
        for (const r of rig.reqs) {
          const o = r.settled[0]!;
          if (o.kind === 'ok') tally.ok++;
          else if (o.err instanceof CancelledError) tally.cancelled++;
          else if (o.err instanceof InferenceError) tally.failed++;
          else if (o.err instanceof DeadlineExceededError) tally.expired++;
          else if (o.err instanceof OverloadedError) tally.overloaded++;
          else if (o.err instanceof EngineClosedError) tally.closed++;
        }
      },
    );
    console.log(`fuzz slot state machine: ${JSON.stringify(tally)}`);
    // The runs reached every outcome: the properties above were not checked on an empty space.
    for (const k of ['ok', 'cancelled', 'failed', 'expired', 'overloaded'] as const) expect(tally[k], k).toBeGreaterThan(0);
  });
});
