/**
 * The engine end to end: real inference thread, real slabs, real onnxruntime
 * on CPU, generated models. The central check: a result computed in a padded
 * batch equals the same input run alone and unpadded (mask and padding must
 * not leak between rows), on fresh random inputs every run.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadTokenizer } from '../dist/src/core/tokenizer/tokenizer.js';
import { createEngine, type Engine } from '../dist/src/index.js';
import { CPU_RUN_TOKENS } from '../dist/src/gpu-worker/runner.js';
import { writePreset } from '../dist/models/generator/presets.js';
import { batchesOfQueued, sentTogether } from './fixtures/queued-together.js';
import { eventually, makeRandom, maxAbsDiff, PlainReference, randomTexts, randomTokenSequences, Reference, vocabularyWords } from './helpers.js';

// Read by createEngine: the batching proofs hold the inference loop while they queue their requests (sentTogether).
process.env.SLABSERVE_TEST_HOOKS = '1';

const TOLERANCE = 1e-5;

let engine: Engine;
let embedRef: Reference;
// The independent references: each model's unmodified model.onnx, one input at a time, finished by the test's code.
let embedPlain: PlainReference;
let intentPlain: PlainReference;

beforeAll(async () => {
  // padded to the bucket here (fixed shapes, as on a GPU); the padTo 'longest' path (CPU's default) has its own test below
  engine = await createEngine({ device: 'cpu', models: ['tiny-embed', 'tiny-intent'], batching: { padTo: 'bucket' }, log: () => {} });
  embedRef = await Reference.open('tiny-embed');
  [embedPlain, intentPlain] = await Promise.all(['tiny-embed', 'tiny-intent'].map((m) => PlainReference.open(m)));
}, 120_000);

afterAll(async () => {
  await engine?.close();
  await embedRef?.close();
  await Promise.all([embedPlain?.close(), intentPlain?.close()]);
});

/** What `e` batches `model` with. */
const batchingOf = (e: Engine, model: string) => e.info().find((m) => m.name === model)!.batching;

function expectNoSlotsInUse() {
  for (const [name, s] of Object.entries(engine.stats())) {
    expect(s.slotsInUse, `slots in use for ${name}`).toBe(0);
  }
}

describe('batched results equal one-at-a-time results', () => {
  it('embeddings of random texts of mixed lengths, sent all at once', async () => {
    const rand = makeRandom('embed mask test');
    const words = vocabularyWords(embedRef.spec);
    const texts = randomTexts(rand, words, 120, 90);
    const tok = await loadTokenizer(embedRef.spec.tokenizerPath);
    const lengths = texts.map((t) => tok.encode(t, { maxLength: 512, truncate: false }).ids.length);
    const before = engine.stats()['tiny-embed']!;

    // All queued at once: the engine batches them (a batch per bucket, padded).
    const batched = await sentTogether(engine.testHooks, { 'tiny-embed': texts.length }, () => Promise.all(texts.map((t) => engine.embed(t))));

    const after = engine.stats()['tiny-embed']!;
    const rows = after.rows - before.rows;
    const batches = after.batches - before.batches;
    expect(rows).toBe(texts.length);
    expect(batches).toBe(batchesOfQueued(lengths, batchingOf(engine, 'tiny-embed')));
    expect(rows / batches).toBeGreaterThan(2); // really batched
    expect(after.paddedTokens - before.paddedTokens).toBeGreaterThan(after.realTokens - before.realTokens); // really padded

    let worst = 0;
    for (let i = 0; i < texts.length; i++) {
      const enc = tok.encode(texts[i]!, { maxLength: 512, truncate: false });
      const ref = await embedRef.row(enc.ids);
      worst = Math.max(worst, maxAbsDiff(batched[i]![0]!, ref.subarray(0, 128)));
    }
    expect(worst).toBeLessThan(TOLERANCE);
    expectNoSlotsInUse();
  });

  it('the comparison is sharp: attending to padding would change the result far beyond the tolerance', async () => {
    const rand = makeRandom('mask sensitivity');
    const [seq] = randomTokenSequences(rand, 1, 10, 10);
    const padded = new Int32Array(16);
    padded.set(seq!.ids);
    const clean = await embedRef.row(seq!.ids);
    const leaky = await embedRef.row(padded); // same tokens + 6 [PAD] with mask 1
    expect(maxAbsDiff(clean.subarray(0, 128), leaky.subarray(0, 128))).toBeGreaterThan(1e-3);
  });

  it('class probabilities and logits, sent all at once: the unmodified graph\'s logits run alone, and their softmax', async () => {
    const rand = makeRandom('classify mask test');
    const texts = randomTexts(rand, vocabularyWords(intentPlain.spec), 80, 60);
    const tok = await loadTokenizer(intentPlain.spec.tokenizerPath);
    const lengths = texts.map((t) => tok.encode(t, { maxLength: 512, truncate: false }).ids.length);
    const before = engine.stats()['tiny-intent']!;
    // One request a text, all queued at once: the engine batches them (padded to the bucket).
    const batched = (await sentTogether(engine.testHooks, { 'tiny-intent': texts.length }, () => Promise.all(texts.map((t) => engine.classify(t))))).map((r) => r[0]!);
    const after = engine.stats()['tiny-intent']!;
    expect(after.rows - before.rows).toBe(texts.length);
    expect(after.batches - before.batches).toBe(batchesOfQueued(lengths, batchingOf(engine, 'tiny-intent')));
    expect(after.batches - before.batches).toBeLessThan(texts.length); // really batched
    expect(after.paddedTokens - before.paddedTokens).toBeGreaterThan(after.realTokens - before.realTokens); // really padded

    let worstProbability = 0;
    let worstLogit = 0;
    const labels = new Set<string>();
    for (let i = 0; i < texts.length; i++) {
      const want = await intentPlain.classification(tok.encode(texts[i]!, { maxLength: 512, truncate: false }).ids);
      const got = batched[i]!;
      worstProbability = Math.max(worstProbability, maxAbsDiff(got.probabilities, want.probabilities));
      worstLogit = Math.max(worstLogit, maxAbsDiff(got.logits, want.logits));
      labels.add(got.label);
      const sum = got.probabilities.reduce((a, b) => a + b, 0);
      expect(sum).toBeCloseTo(1, 5);
      expect(got.score).toBe(Math.max(...got.probabilities));
      expect(got.label).toBe(intentPlain.spec.labels[want.probabilities.indexOf(Math.max(...want.probabilities))]);
    }
    console.log(`engine classify: ${texts.length} rows in ${after.batches - before.batches} batches; worst |probability| ${worstProbability.toExponential(2)}, |logit| ${worstLogit.toExponential(2)}`);
    expect(worstProbability).toBeLessThan(TOLERANCE);
    expect(worstLogit).toBeLessThan(TOLERANCE);
    expect(labels.size).toBeGreaterThan(1);
  });
});

describe('padding to the longest input instead of the bucket', () => {
  it('one FIFO bucket padded to the longest in each batch: same results, fewer padded tokens than the bucket', async () => {
    const fifo = await createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { buckets: [512], padTo: 'longest' }, log: () => {} });
    try {
      const rand = makeRandom('pad to longest');
      const texts = randomTexts(rand, vocabularyWords(embedRef.spec), 96, 90);
      const before = fifo.stats()['tiny-embed']!;
      const batched = await sentTogether(fifo.testHooks, { 'tiny-embed': texts.length }, () => Promise.all(texts.map((t) => fifo.embed(t))));
      const after = fifo.stats()['tiny-embed']!;
      const rows = after.rows - before.rows;
      const padded = after.paddedTokens - before.paddedTokens;
      // All queued at once in the one bucket: full batches of maxBatchSize (32; 512-token rows fit 16384 / 512 = 32).
      expect(after.batches - before.batches).toBe(Math.ceil(texts.length / 32));
      expect(padded).toBeGreaterThan(after.realTokens - before.realTokens); // mixed lengths: some padding
      expect(padded).toBeLessThan(rows * 512); // ...but not to the bucket's 512
      const tok = await loadTokenizer(embedRef.spec.tokenizerPath);
      let worst = 0;
      for (let i = 0; i < texts.length; i++) {
        const ref = await embedRef.row(tok.encode(texts[i]!, { maxLength: 512, truncate: false }).ids);
        worst = Math.max(worst, maxAbsDiff(batched[i]![0]!, ref.subarray(0, 128)));
      }
      expect(worst).toBeLessThan(TOLERANCE);
    } finally {
      await fifo.close();
    }
  }, 60_000);

  it(`a CPU batch of more than ${CPU_RUN_TOKENS} tokens runs as several onnxruntime runs, longest first, each padded to its own longest: same results`, async () => {
    // One bucket, a large token budget: batches of up to 32 rows of 20-300 tokens, several times CPU_RUN_TOKENS.
    const big = await createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { buckets: [512], padTo: 'longest', maxBatchTokens: 16_384 }, log: () => {} });
    try {
      const rand = makeRandom('cpu runs');
      const seqs = randomTokenSequences(rand, 96, 20, 300);
      const before = big.stats()['tiny-embed']!;
      // Three requests of 32 (one part each: a larger request streams its parts, core/client-batches.ts), all queued at once.
      const parts = [0, 32, 64].map((from) => seqs.slice(from, from + 32));
      const results = (await sentTogether(big.testHooks, { 'tiny-embed': seqs.length }, () => Promise.all(parts.map((p) => big.runTokens('tiny-embed', p))))).flat();
      const after = big.stats()['tiny-embed']!;
      const rows = after.rows - before.rows;
      const real = after.realTokens - before.realTokens;
      const padded = after.paddedTokens - before.paddedTokens;
      expect(rows).toBe(seqs.length);
      expect(after.batches - before.batches).toBe(3); // batches of 32 rows, far over CPU_RUN_TOKENS
      // One run per batch would pad each row to the batch's longest, near 300 against a mean of 160
      // (padded/real about 1.8); runs of similar lengths, longest first, waste little.
      expect(padded / real).toBeLessThan(1.25);
      let worst = 0;
      for (let i = 0; i < seqs.length; i++) worst = Math.max(worst, maxAbsDiff(results[i]!.output, await embedRef.row(seqs[i]!.ids)));
      expect(worst).toBeLessThan(TOLERANCE);
    } finally {
      await big.close();
    }
  }, 60_000);
});

describe('many concurrent requests', () => {
  it('pre-tokenized inputs across every bucket: each answered once, with its own row', async () => {
    const rand = makeRandom('concurrency test');
    const seqs = randomTokenSequences(rand, 400, 3, 300);
    const results = await engine.runTokens('tiny-embed', seqs);
    expect(results).toHaveLength(seqs.length);
    let worst = 0;
    for (let i = 0; i < seqs.length; i++) {
      const ref = await embedRef.row(seqs[i]!.ids);
      worst = Math.max(worst, maxAbsDiff(results[i]!.output, ref));
    }
    expect(worst).toBeLessThan(TOLERANCE);
    expectNoSlotsInUse();
  });

  it('three models at once, two of them embedding models of one width: each request answered by its own model, by value', async () => {
    // tiny-minilm: tiny-embed's layout and tokenizer (mean pooling, normalised) with other weights, so that a row
    // from the wrong embedding model has the right length and only its values can tell it apart.
    const root = mkdtempSync(join(tmpdir(), 'slabserve-engine-models-'));
    const minilmDir = writePreset('tiny-minilm', root).dir;
    const three = await createEngine({ device: 'cpu', models: ['tiny-embed', minilmDir, 'tiny-intent'], batching: { buckets: [16, 32, 64], padTo: 'bucket' }, log: () => {} });
    const minilmPlain = await PlainReference.open(minilmDir);
    try {
      const rand = makeRandom('three models');
      const texts = randomTexts(rand, vocabularyWords(embedPlain.spec), 40, 20);
      const before = three.stats();
      const models = ['tiny-embed', 'tiny-minilm', 'tiny-intent'];
      // Every text to every model, interleaved, all queued at once.
      const answers = await sentTogether(three.testHooks, Object.fromEntries(models.map((m) => [m, texts.length])), () =>
        Promise.all(texts.map((t) => Promise.all([three.embed(t, { model: 'tiny-embed' }), three.embed(t, { model: 'tiny-minilm' }), three.classify(t, { model: 'tiny-intent' })]))),
      );
      const after = three.stats();
      const toks = await Promise.all([embedPlain, minilmPlain, intentPlain].map((r) => loadTokenizer(r.spec.tokenizerPath)));
      const ids = (k: number, t: string) => toks[k]!.encode(t, { maxLength: 64, truncate: false }).ids;
      for (const [k, m] of models.entries()) {
        expect(after[m]!.rows - before[m]!.rows, m).toBe(texts.length);
        expect(after[m]!.batches - before[m]!.batches, m).toBe(batchesOfQueued(texts.map((t) => ids(k, t).length), batchingOf(three, m)));
        expect(after[m]!.batches - before[m]!.batches, m).toBeLessThan(texts.length); // batched
      }
      let worstEmbed = 0;
      let worstMinilm = 0;
      let worstIntent = 0;
      let closestModels = Infinity;
      for (const [i, t] of texts.entries()) {
        const [[emb], [mini], [cls]] = answers[i]!;
        const wantEmbed = await embedPlain.embedding(ids(0, t));
        const wantMinilm = await minilmPlain.embedding(ids(1, t));
        const wantIntent = await intentPlain.classification(ids(2, t));
        worstEmbed = Math.max(worstEmbed, maxAbsDiff(emb!, wantEmbed));
        worstMinilm = Math.max(worstMinilm, maxAbsDiff(mini!, wantMinilm));
        worstIntent = Math.max(worstIntent, maxAbsDiff(cls!.probabilities, wantIntent.probabilities), maxAbsDiff(cls!.logits, wantIntent.logits));
        // The check is sharp: the two embedding models' references are far apart on every text.
        closestModels = Math.min(closestModels, maxAbsDiff(wantEmbed, wantMinilm));
      }
      console.log(`three models: worst tiny-embed ${worstEmbed.toExponential(2)}, tiny-minilm ${worstMinilm.toExponential(2)}, tiny-intent ${worstIntent.toExponential(2)}; the embedding models at least ${closestModels.toExponential(2)} apart`);
      expect(worstEmbed).toBeLessThan(TOLERANCE);
      expect(worstMinilm).toBeLessThan(TOLERANCE);
      expect(worstIntent).toBeLessThan(TOLERANCE);
      expect(closestModels).toBeGreaterThan(1e-2);
      for (const [name, s] of Object.entries(three.stats())) expect(s.slotsInUse, `slots in use for ${name}`).toBe(0);
    } finally {
      await minilmPlain.close();
      await three.close();
      rmSync(root, { recursive: true, force: true });
    }
  }, 60_000);
});

describe('request options and errors', () => {
  it('normalize: false returns the unnormalised mean-pooled vector', async () => {
    const [unit] = await engine.embed('where is my parcel', { normalize: true });
    const [raw] = await engine.embed('where is my parcel', { normalize: false });
    const norm = Math.hypot(...raw!);
    expect(Math.hypot(...unit!)).toBeCloseTo(1, 5);
    expect(Math.abs(norm - 1)).toBeGreaterThan(1e-3);
    expect(maxAbsDiff(raw!.map((x) => x / norm), unit!)).toBeLessThan(1e-5);
  });

  it('rejects bad input with typed errors and leaks no slot', async () => {
    await expect(engine.embed([])).rejects.toMatchObject({ code: 'SLABSERVE_INVALID_INPUT' });
    await expect(engine.embed('')).rejects.toMatchObject({ code: 'SLABSERVE_INVALID_INPUT' });
    await expect(engine.embed([42 as unknown as string])).rejects.toMatchObject({ code: 'SLABSERVE_INVALID_INPUT' });
    await expect(engine.embed('hi', { model: 'nope' })).rejects.toMatchObject({ code: 'SLABSERVE_MODEL_NOT_FOUND' });
    await expect(engine.classify('hi', { model: 'tiny-embed' })).rejects.toMatchObject({ code: 'SLABSERVE_INVALID_INPUT' });
    const long = 'parcel '.repeat(600);
    await expect(engine.embed(long)).rejects.toMatchObject({ code: 'SLABSERVE_INPUT_TOO_LONG', type: 'too_long' });
    const [cut] = await engine.embed(long, { truncate: true });
    expect(cut).toHaveLength(128);
    expectNoSlotsInUse();
  });

  it('a request with no time left never runs', async () => {
    const before = engine.stats()['tiny-embed']!;
    await expect(engine.embed('too late', { timeoutMs: 0 })).rejects.toMatchObject({ code: 'SLABSERVE_DEADLINE_EXCEEDED', type: 'timeout' });
    const after = engine.stats()['tiny-embed']!;
    expect(after.rows).toBe(before.rows);
    expectNoSlotsInUse();
  });

  it('an aborted request is cancelled and frees its slot', async () => {
    const ac = new AbortController();
    ac.abort();
    await expect(engine.embed('never mind', { signal: ac.signal })).rejects.toMatchObject({ code: 'SLABSERVE_CANCELLED' });
    // Abort while a burst is in flight: each either completes or is cancelled, none hangs.
    const ac2 = new AbortController();
    const burst = randomTexts(makeRandom('abort burst'), vocabularyWords(embedRef.spec), 50, 30).map((t) =>
      engine.embed(t, { signal: ac2.signal }).then(
        () => 'done',
        (e: { code: string }) => e.code,
      ),
    );
    setImmediate(() => ac2.abort());
    const outcomes = await Promise.all(burst);
    expect(outcomes.every((o) => o === 'done' || o === 'SLABSERVE_CANCELLED')).toBe(true);
    expect(outcomes).toContain('SLABSERVE_CANCELLED');
    // The inference thread frees the cancelled slots when it next meets them (after the batch it may be running).
    await eventually('cancelled slots freed', async () => Object.values(engine.stats()).map((s) => s.slotsInUse), (inUse) => inUse.every((n) => n === 0));
    expectNoSlotsInUse();
  });
});

describe('limits', () => {
  it('answers overload at once when every slot is taken, and recovers', async () => {
    const small = await createEngine({
      device: 'cpu',
      models: ['tiny-embed'],
      slotsPerModel: 8,
      batching: { buckets: [16, 32] },
      log: () => {},
    });
    try {
      const seqs = randomTokenSequences(makeRandom('overload'), 40, 5, 30);
      const outcomes = await Promise.all(
        seqs.map((s) =>
          small.runTokens('tiny-embed', [s]).then(
            () => 'ok',
            (e: { code: string; retryAfterSeconds?: number }) => e.code,
          ),
        ),
      );
      expect(outcomes.filter((o) => o === 'ok').length).toBeGreaterThanOrEqual(8);
      expect(outcomes).toContain('SLABSERVE_OVERLOADED');
      expect(outcomes.every((o) => o === 'ok' || o === 'SLABSERVE_OVERLOADED')).toBe(true);
      expect(small.stats()['tiny-embed']!.slotsInUse).toBe(0);
      const again = await small.runTokens('tiny-embed', seqs.slice(0, 8));
      expect(again).toHaveLength(8);
      expect(small.info()[0]!.maxLength).toBe(32);
    } finally {
      await small.close();
    }
    await expect(small.embed('after close')).rejects.toMatchObject({ code: 'SLABSERVE_ENGINE_CLOSED' });
  }, 60_000);

  it('maxBatchSize 1 (no batching): starts (its warm-up fits one row), runs every request alone, with the reference rows', async () => {
    const alone = await createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { maxBatchSize: 1 }, log: () => {} });
    try {
      const seqs = randomTokenSequences(makeRandom('max batch size 1'), 24, 3, 60);
      const before = alone.stats()['tiny-embed']!;
      const rows = await Promise.all(seqs.map((s) => alone.runTokens('tiny-embed', [s])));
      const after = alone.stats()['tiny-embed']!;
      expect(after.rows - before.rows).toBe(seqs.length);
      expect(after.batches - before.batches).toBe(seqs.length); // one request a batch (no hold needed: with maxBatchSize 1 no timing makes it otherwise)
      for (let i = 0; i < seqs.length; i++) expect(maxAbsDiff(rows[i]![0]!.output, await embedRef.row(seqs[i]!.ids))).toBeLessThan(TOLERANCE);
    } finally {
      await alone.close();
    }
  }, 60_000);

  it('refuses batching options that cannot work, with a clear message', async () => {
    await expect(createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { maxBatchSize: 0 }, log: () => {} })).rejects.toThrow(
      /maxBatchSize must be a positive integer/,
    );
    await expect(
      createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { maxBatchTokens: 100 }, log: () => {} }),
    ).rejects.toThrow(/maxBatchTokens \(100\) must be at least the longest bucket \(512\)/);
    await expect(createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { buckets: [32, 16] }, log: () => {} })).rejects.toThrow(
      /ascending/,
    );
    await expect(
      createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { padTo: 'shortest' as 'longest' }, log: () => {} }),
    ).rejects.toThrow(/padTo must be one of auto, bucket, longest/);
    await expect(
      createEngine({ device: 'cpu', models: ['tiny-embed'], batching: { buckets: Array.from({ length: 65 }, (_, i) => 8 + i) }, log: () => {} }),
    ).rejects.toThrow(/at most 64 buckets \(--buckets\), got 65/);
    await expect(createEngine({ device: 'tpu', models: ['tiny-embed'], log: () => {} })).rejects.toThrow(/invalid device "tpu"/);
  });
});
