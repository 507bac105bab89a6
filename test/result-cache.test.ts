/**
 * The result cache's table (src/shared/result-cache.ts), built code in dist/:
 * one thread (exact rows back, keys, eviction, bytes, per-model shares), then
 * worker threads (test/fixtures/cache-worker.mjs) hammering a tiny table where
 * every row is a fixed function of its key, and a writer terminated while it
 * holds an entry half written. Random inputs print their seed
 * (SLABSERVE_TEST_SEED replays one).
 */
import { once } from 'node:events';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { cacheByteLength, cacheLayout, KEY_TOKENS, ResultCache, WAYS, type CacheKey, type CacheLayout } from '../dist/src/shared/result-cache.js';
import { isRowOf, keyOf, rowOf } from './fixtures/cache-keys.mjs';
import { makeRandom } from './helpers.js';

const fixture = new URL('./fixtures/cache-worker.mjs', import.meta.url);

/** A layout of `sets` sets of one model (rows `width` wide, keys of at most `keyTokens`). */
const tiny = (sets: number, width: number, keyTokens: number, owners = 1): CacheLayout => ({ owners, sets, models: [{ width, keyTokens }] });

const bits = (row: Float32Array) => Array.from(new Uint32Array(row.buffer, row.byteOffset, row.length));

/** A row of random bits: NaNs with payloads, -0 and subnormals come up, and must come back as they went in. */
function randomRow(rand: () => number, width: number): Float32Array {
  const b = Uint32Array.from({ length: width }, () => Math.floor(rand() * 2 ** 32));
  return new Float32Array(b.buffer);
}

function randomKey(rand: () => number, maxTokens: number): CacheKey & { typeIds: Int32Array } {
  const n = 1 + Math.floor(rand() * maxTokens);
  return {
    ids: Int32Array.from({ length: n }, () => Math.floor(rand() * 30_000)),
    typeIds: Int32Array.from({ length: n }, () => (rand() < 0.3 ? 1 : 0)),
    poolFrom: rand() < 0.5 ? 0 : Math.floor(rand() * n),
  };
}

function get(cache: ResultCache, key: CacheKey, width: number, model = 0): Float32Array | null {
  const out = new Float32Array(width);
  return cache.get(model, key, out, 0) ? out : null;
}

describe('the result cache, one thread', () => {
  it('a hit is the row stored, bit for bit, and a copy of it', () => {
    const rand = makeRandom('result-cache exact');
    const width = 129;
    const cache = ResultCache.create(cacheLayout(4 * 2 ** 20, [{ width, maxLength: 512 }], 1));
    const keys = Array.from({ length: 300 }, () => randomKey(rand, KEY_TOKENS));
    const rows = keys.map(() => randomRow(rand, width));
    keys.forEach((k, i) => cache.put(0, k, rows[i]!, 0));
    let found = 0;
    keys.forEach((k, i) => {
      const got = get(cache, k, width);
      if (!got) return; // two random keys may share one (and a later one may have replaced it): checked below
      found++;
      expect(bits(got), `key ${i}`).toEqual(bits(rows[i]!));
      got.fill(0); // the caller's copy: the cache keeps its own
      expect(bits(get(cache, k, width)!)).toEqual(bits(rows[i]!));
    });
    // 300 keys in 4 MiB (thousands of sets): every one is there.
    expect(found).toBe(keys.length);
    // A row stored from the middle of a request's rows (offset), read into the middle of another's.
    const many = new Float32Array(3 * width);
    many.set(rows[7]!, width);
    const key = randomKey(rand, 8);
    cache.put(0, key, many, width);
    const into = new Float32Array(3 * width);
    expect(cache.get(0, key, into, 2 * width)).toBe(true);
    expect(bits(into.subarray(2 * width))).toEqual(bits(rows[7]!));
    expect(into.subarray(0, 2 * width).every((v) => v === 0)).toBe(true);
  });

  it('a key differing in one token id, one type id or the pooling start misses; null type ids are all zeros', () => {
    const rand = makeRandom('result-cache keys');
    const width = 8;
    const cache = ResultCache.create(cacheLayout(2 ** 20, [{ width, maxLength: 512 }], 1));
    for (let round = 0; round < 50; round++) {
      const key = randomKey(rand, 20);
      const row = randomRow(rand, width);
      cache.put(0, key, row, 0);
      expect(bits(get(cache, key, width)!)).toEqual(bits(row));
      const at = Math.floor(rand() * key.ids.length);
      const id = { ...key, ids: key.ids.slice() };
      id.ids[at] = id.ids[at]! + 1;
      const type = { ...key, typeIds: key.typeIds.slice() };
      type.typeIds[at] = 1 - type.typeIds[at]!;
      const pool = { ...key, poolFrom: (key.poolFrom ?? 0) + 1 };
      const shorter = { ids: key.ids.slice(0, -1), typeIds: key.typeIds.slice(0, -1), poolFrom: key.poolFrom };
      for (const [what, k] of [['id', id], ['type id', type], ['pool start', pool], ['one token less', shorter]] as const) {
        if (k.ids.length === 0) continue;
        expect(get(cache, k, width), `${what} at ${at}, round ${round}`).toBeNull();
      }
    }
    const zeros = { ids: Int32Array.from([101, 7592, 102]), typeIds: new Int32Array(3) };
    const row = randomRow(rand, width);
    cache.put(0, zeros, row, 0);
    expect(bits(get(cache, { ids: [101, 7592, 102], typeIds: null }, width)!)).toEqual(bits(row));
  });

  it('an input longer than the key room, or with an id from 2^24, is not stored, and its lookups count as misses', () => {
    const width = 4;
    const cache = ResultCache.create(tiny(4, width, 8));
    const long = { ids: Int32Array.from({ length: 9 }, (_, i) => i + 1), typeIds: null };
    const huge = { ids: [101, 2 ** 24, 102], typeIds: null };
    const row = Float32Array.from([1, 2, 3, 4]);
    cache.put(0, long, row, 0);
    cache.put(0, huge, row, 0);
    expect(get(cache, long, width)).toBeNull();
    expect(get(cache, huge, width)).toBeNull();
    expect(cache.statsOf(0)).toMatchObject({ hits: 0, misses: 2, entries: 0, bytes: 0 });
    const fits = { ids: long.ids.slice(0, 8), typeIds: null };
    cache.put(0, fits, row, 0);
    expect(Array.from(get(cache, fits, width)!)).toEqual([1, 2, 3, 4]);
    expect(cache.statsOf(0)).toMatchObject({ hits: 1, misses: 2, entries: 1 });
  });

  it('stays within its bytes: the buffer within the budget, the rows held within the capacity, evictions = stores - entries', () => {
    const rand = makeRandom('result-cache bytes');
    const budget = 100_000 + Math.floor(rand() * 200_000);
    const layout = cacheLayout(budget, [{ width: 16, maxLength: 512 }], 3, 8);
    const cache = ResultCache.create(layout);
    expect(cache.buffer.byteLength).toBe(cacheByteLength(layout));
    expect(cache.buffer.byteLength).toBeLessThanOrEqual(budget);
    // Nearly all of it is used: less than one more set would fit.
    const capacity = layout.sets * WAYS;
    const stats0 = cache.statsOf(0);
    expect(budget - cache.buffer.byteLength).toBeLessThan(stats0.capacityBytes / layout.sets + 256);
    const keys = 50 * capacity;
    for (let k = 0; k < keys; k++) {
      cache.put(0, keyOf(k, 8), rowOf(k, 16), 0);
      if (k % 997 === 0) {
        const s = cache.statsOf(0);
        expect(s.entries).toBeLessThanOrEqual(capacity);
        expect(s.bytes).toBeLessThanOrEqual(s.capacityBytes);
      }
    }
    const s = cache.statsOf(0);
    // Every set full (50 keys a set on average), every store after that an eviction.
    expect(s.entries).toBe(capacity);
    expect(s.bytes).toBe(s.capacityBytes);
    expect(s.evictions).toBe(keys - capacity);
    // What is held is right: every key found has its own row.
    let found = 0;
    for (let k = 0; k < keys; k++) {
      const got = get(cache, keyOf(k, 8), 16);
      if (got) {
        found++;
        expect(isRowOf(got, k), `key ${k}`).toBe(true);
      }
    }
    expect(found).toBe(capacity);
  });

  it('per-model shares: every model the same number of rows; one model flooding its share evicts none of another', () => {
    const rand = makeRandom('result-cache shares');
    const narrow = 16;
    const wide = 200;
    const layout = cacheLayout(400_000, [{ width: narrow, maxLength: 512 }, { width: wide, maxLength: 512 }], 2, 8);
    const cache = ResultCache.create(layout);
    const a = cache.statsOf(0);
    const b = cache.statsOf(1);
    // Equal entries, so the wide model's share is larger in proportion to its entry.
    expect(b.capacityBytes / a.capacityBytes).toBeCloseTo((Math.ceil((6 + 8 + wide) / 16) * 16) / (Math.ceil((6 + 8 + narrow) / 16) * 16), 10);
    expect(a.capacityBytes + b.capacityBytes).toBeLessThanOrEqual(400_000);
    // Model 1 holds some rows; model 0 is then flooded with twenty times its share.
    const offset = Math.floor(rand() * 1e6);
    const held: number[] = [];
    for (let k = offset; k < offset + layout.sets * 2; k++) cache.put(1, keyOf(k, 8), rowOf(k, wide), 0);
    for (let k = offset; k < offset + layout.sets * 2; k++) if (get(cache, keyOf(k, 8), wide, 1)) held.push(k);
    expect(held.length).toBeGreaterThan(layout.sets); // most: some sets got more than WAYS of them
    for (let k = 0; k < 20 * layout.sets * WAYS; k++) cache.put(0, keyOf(k, 8), rowOf(k, narrow), 0);
    expect(cache.statsOf(0).entries).toBe(layout.sets * WAYS);
    for (const k of held) expect(isRowOf(get(cache, keyOf(k, 8), wide, 1)!, k), `model 1 key ${k}`).toBe(true);
    expect(cache.statsOf(1).entries).toBe(held.length);
    // The same token ids are different keys in different models.
    expect(get(cache, keyOf(offset, 8), narrow, 0)).toBeNull();
  });

  it('eviction: a row hit often outlives one-off texts in its set, and leaves once unused for a while', () => {
    const width = 4;
    const cache = ResultCache.create(tiny(1, width, 8));
    const popular = keyOf(0, 8);
    cache.put(0, popular, rowOf(0, width), 0);
    for (let i = 0; i < 5; i++) expect(get(cache, popular, width)).not.toBeNull();
    for (let k = 1; k < WAYS; k++) cache.put(0, keyOf(k, 8), rowOf(k, width), 0); // the set is full
    // Five one-off texts: each evicts the least used, never the popular one.
    for (let k = 100; k < 105; k++) cache.put(0, keyOf(k, 8), rowOf(k, width), 0);
    expect(cache.statsOf(0).evictions).toBe(5);
    expect(isRowOf(get(cache, popular, width)!, 0)).toBe(true);
    // Unused from now on: every eviction takes one from its count, so it goes.
    for (let k = 200; k < 240; k++) cache.put(0, keyOf(k, 8), rowOf(k, width), 0);
    expect(get(cache, popular, width)).toBeNull();
  });

  it('refuses a budget that cannot hold one set of every model', () => {
    expect(() => cacheLayout(1000, [{ width: 129, maxLength: 512 }], 2)).toThrow(RangeError);
    expect(() => new ResultCache(new SharedArrayBuffer(64), tiny(1, 4, 8), 0)).toThrow(RangeError);
    expect(() => ResultCache.create(tiny(1, 4, 8, 2), 2)).toThrow(RangeError);
  });
});

describe('the result cache across threads', () => {
  it('writers and readers on many threads over a tiny table: no read ever returns a torn row or another key\'s', { timeout: 60_000 }, async () => {
    const rand = makeRandom('result-cache threads');
    const threads = 4;
    const layout = tiny(2, 96, 8, threads); // 16 entries for 40 keys: constant eviction, constant contention
    const cache = ResultCache.create(layout);
    const workers = Array.from(
      { length: threads },
      (_, owner) =>
        new Worker(fixture, {
          workerData: { buffer: cache.buffer, layout, owner, role: 'mixed', seed: Math.floor(rand() * 2 ** 31), iterations: 150_000, keyCount: 40 },
        }),
    );
    // once() rejects on 'error', so a thread that throws fails the test instead of hanging it.
    const tallies = (await Promise.all(workers.map(async (w) => (await once(w, 'message'))[0]))) as { hits: number; misses: number; wrong: number; firstWrong: unknown }[];
    await Promise.all(workers.map((w) => w.terminate()));
    console.log(`result-cache threads: ${JSON.stringify(tallies)}; ${JSON.stringify(cache.statsOf(0))}`);
    expect(tallies.map((t) => t.firstWrong)).toEqual(tallies.map(() => null));
    expect(tallies.reduce((n, t) => n + t.wrong, 0)).toBe(0);
    // It was a real contest: rows were found and replaced all the time.
    const s = cache.statsOf(0);
    expect(s.hits).toBeGreaterThan(1000);
    expect(s.evictions).toBeGreaterThan(1000);
    expect(s.hits + s.misses).toBe(threads * 150_000);
    // Afterwards every entry is whole and free: each key found is right, and a new one is stored.
    for (let k = 0; k < 40; k++) {
      const got = get(cache, keyOf(k, 8), 96);
      if (got) expect(isRowOf(got, k), `key ${k}`).toBe(true);
    }
    expect(s.entries).toBe(16);
  });

  it('a writer terminated mid-write: its entry is a miss, never a torn row, the rest serves, and reclaim makes it usable again', { timeout: 30_000 }, async () => {
    const width = 32;
    const layout = tiny(1, width, 8, 3); // one set: every key in it
    const cache = ResultCache.create(layout); // this thread is owner 0, as the main thread is
    for (let k = 0; k < WAYS; k++) cache.put(0, keyOf(k, 8), rowOf(k, width), 0);
    for (let k = 1; k < WAYS; k++) get(cache, keyOf(k, 8), width); // key 0 the least used: the stuck writer replaces it
    const flag = new SharedArrayBuffer(8);
    const stuck = new Worker(fixture, { workerData: { buffer: cache.buffer, layout, owner: 2, role: 'stuck', key: 100, flag } });
    const failed = once(stuck, 'error').then(([e]) => {
      throw e;
    });
    const signal = new Int32Array(flag);
    await Promise.race([failed, Atomics.waitAsync(signal, 0, 0, 10_000).value]);
    expect(Atomics.load(signal, 0)).toBe(1); // it holds the entry, its key written, its row not yet

    const check = () => {
      expect(get(cache, keyOf(0, 8), width)).toBeNull(); // the row being replaced: a miss, not a torn row
      expect(get(cache, keyOf(100, 8), width)).toBeNull(); // the half-written one: a miss
      for (let k = 1; k < WAYS; k++) expect(isRowOf(get(cache, keyOf(k, 8), width)!, k), `key ${k}`).toBe(true);
    };
    check();
    // Writers skip it: eight new keys go into the other seven entries.
    for (let k = 200; k < 208; k++) cache.put(0, keyOf(k, 8), rowOf(k, width), 0);
    expect(get(cache, keyOf(0, 8), width)).toBeNull();
    expect(get(cache, keyOf(100, 8), width)).toBeNull();
    expect(cache.statsOf(0).entries).toBe(WAYS - 1);

    await stuck.terminate();
    // Still skipped until the main thread, seeing the thread gone, frees what it held.
    cache.put(0, keyOf(300, 8), rowOf(300, width), 0);
    expect(cache.statsOf(0).entries).toBe(WAYS - 1);
    expect(cache.reclaim(1)).toBe(0); // another owner's locks are not touched
    expect(cache.reclaim(2)).toBe(1);
    expect(cache.reclaim(2)).toBe(0);
    expect(get(cache, keyOf(100, 8), width)).toBeNull(); // emptied, not published half-written
    cache.put(0, keyOf(400, 8), rowOf(400, width), 0); // into the freed entry: no eviction
    expect(cache.statsOf(0).entries).toBe(WAYS);
    expect(isRowOf(get(cache, keyOf(400, 8), width)!, 400)).toBe(true);
    // The whole set serves again: each of eight new keys stored is found right after.
    for (let k = 500; k < 508; k++) {
      cache.put(0, keyOf(k, 8), rowOf(k, width), 0);
      expect(isRowOf(get(cache, keyOf(k, 8), width)!, k), `key ${k}`).toBe(true);
    }
  });
});
