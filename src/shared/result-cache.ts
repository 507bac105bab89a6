/**
 * The result cache (docs/cache.md): finished rows in one
 * SharedArrayBuffer that every owner thread of the process (each gateway
 * thread, or the engine's own) reads and writes, so a text any of them has run
 * is answered by any of them without a slot or the inference thread.
 *
 * What is cached is the row exactly as the inference thread wrote it into the
 * slot (before any dialect's post-processing: `normalize` false, sorting, top
 * labels), keyed by everything that decides it: the model, the token ids,
 * their type ids and the pooling start (slab.ts H_POOL_FROM). A hit copies
 * those bytes back: it equals the miss bit for bit, whatever route asks.
 *
 * Layout (int32 words; every entry and region 64-byte aligned):
 *   stats    float64 x STATS per (owner, model): hits, misses, evictions, and the
 *            change in live entries; each owner writes only its own row (plain
 *            writes, one writer), the main thread sums the rows at scrape time
 *   regions  one per model, `sets` x WAYS entries each: every model the same
 *            number of entries, so a region's bytes are proportional to its
 *            entry (key capacity + row); one model filling its region evicts
 *            only its own entries and never starves another
 *   entry    SEQ  even: stable (the version); odd: being written
 *            LOCK 0: free; 1 + owner: a writer holds it (taken by compareExchange)
 *            USE  hits since it was stored, less one per eviction in its set
 *            HASH, LEN (key tokens; 0: empty), POOL (the pooling start)
 *            key  LEN words of `id | type << 24` (room for keyTokens)
 *            row  `width` float32
 *   All zero is an empty table: nothing is written at start, and pages are
 *   touched (resident) only as entries are stored.
 *
 * Concurrency. No thread ever waits for another, so a thread that dies
 * mid-write blocks nobody:
 *   writer  takes an entry's LOCK (compareExchange 0 -> 1 + owner; taken: skip
 *           it), then SEQ v -> v + 1 (Atomics.add), writes key and row, stores
 *           SEQ v + 2 (published), then LOCK 0.
 *   reader  reads SEQ (odd: a miss for this entry), compares the whole key
 *           (not only the hash), copies the row out, then reads SEQ again with
 *           a read-modify-write (Atomics.add 0): unchanged, the copy is whole;
 *           changed, a miss. Both steps on SEQ being read-modify-writes is what
 *           makes this hold in the memory model, not only on x86: of a reader's
 *           check and a writer's v -> v + 1, the later reads from the earlier,
 *           so either the check sees v + 1 or the copy happened before the
 *           writer's first store (a plain load would order nothing).
 *   dead    a writer that died leaves LOCK = 1 + owner (and maybe SEQ odd): its
 *           entry is a miss to readers and skipped by writers; the other WAYS - 1
 *           entries of its set serve meanwhile. The main thread, once the thread
 *           has exited and before its replacement starts (src/main/threads/gateway-supervisor.ts),
 *           calls reclaim(owner): a half-written entry is emptied, the lock freed.
 *
 * Eviction: a new key goes into its set's first empty entry, else the one with
 * the fewest USE; every eviction also takes one from each other entry's USE,
 * so an entry hit often stays until it has gone unused for a while (a few
 * counts: USE_MAX), and one-off texts replace each other.
 *
 * Cost: a lookup hashes the input's words once, then reads up to WAYS entries'
 * SEQ and HASH (one cache line each); a hit compares the key and copies the
 * row. Inputs longer than keyTokens (default 64 tokens), or with an id from
 * 2^24 or a type id from 128, are not cached (counted as misses).
 */

/** Entries per set. */
export const WAYS = 8;
/** Longest input cached, in tokens (the key's room per entry); chat and search repeats are short. */
export const KEY_TOKENS = 64;
/** A hit count saturates here: the most evictions in its set an entry outlives unused. */
const USE_MAX = 15;

const E_SEQ = 0;
const E_LOCK = 1;
const E_USE = 2;
const E_HASH = 3;
const E_LEN = 4;
const E_POOL = 5;
const E_KEY = 6;

/** Per (owner, model) statistics, float64 each. */
const S_HITS = 0;
const S_MISSES = 1;
const S_EVICTIONS = 2;
const S_LIVE = 3; // entries stored less entries evicted by this owner (summed over owners: the entries held)
const STATS = 4;

const LINE_WORDS = 16; // 64 bytes
const alignWords = (n: number) => Math.ceil(n / LINE_WORDS) * LINE_WORDS;

export interface CacheModelLayout {
  /** Row width (float32), the slab's outputWidth. */
  width: number;
  /** Longest key cached, in tokens. */
  keyTokens: number;
}

/** Plain data: crosses to every thread with the buffer. */
export interface CacheLayout {
  owners: number;
  /** Sets per model (every model the same). */
  sets: number;
  models: CacheModelLayout[];
}

/** One input as a key: what the slot holds (submitter.ts SubmitInput). */
export interface CacheKey {
  ids: ArrayLike<number>;
  typeIds: ArrayLike<number> | null;
  poolFrom?: number | undefined;
}

export interface CacheStats {
  hits: number;
  misses: number;
  evictions: number;
  /** Entries held now, and their bytes (key room and row, as laid out). */
  entries: number;
  bytes: number;
  /** The model's region. */
  capacityBytes: number;
}

/** Words of one entry of `m`. */
function entryWords(m: CacheModelLayout): number {
  return alignWords(E_KEY + m.keyTokens + m.width);
}

function statsWords(l: { owners: number; models: unknown[] }): number {
  return alignWords(l.owners * l.models.length * STATS * 2);
}

/** Bytes of the buffer for `layout`. */
export function cacheByteLength(layout: CacheLayout): number {
  let words = statsWords(layout);
  for (const m of layout.models) words += layout.sets * WAYS * entryWords(m);
  return words * 4;
}

/**
 * The largest layout within `budgetBytes` (--cache-mb): as many sets per model
 * as fit, every model the same number. Throws when not even one set of each fits.
 */
export function cacheLayout(budgetBytes: number, models: { width: number; maxLength: number }[], owners: number, keyTokens = KEY_TOKENS): CacheLayout {
  const ms = models.map((m) => ({ width: m.width, keyTokens: Math.min(keyTokens, m.maxLength) }));
  const perSet = ms.reduce((sum, m) => sum + WAYS * entryWords(m) * 4, 0);
  const sets = Math.floor((budgetBytes - statsWords({ owners, models: ms }) * 4) / perSet);
  if (!(sets >= 1)) throw new RangeError(`a result cache of ${budgetBytes} bytes cannot hold one set of ${WAYS} rows of each model (${perSet} bytes)`);
  return { owners, sets, models: ms };
}

/** The layout of --cache-mb for these models (their row widths and max lengths, from their plans). */
export function cacheLayoutOf(cacheMb: number, plans: readonly { layout: { outputWidth: number }; maxLength: number }[], owners: number): CacheLayout {
  return cacheLayout(Math.floor(cacheMb * 2 ** 20), plans.map((p) => ({ width: p.layout.outputWidth, maxLength: p.maxLength })), owners);
}

/**
 * The key's hash (31 bits), or -1 when the input cannot be cached: longer
 * than `keyTokens`, or an id or type id too large for a key word.
 */
export function keyHash(key: CacheKey, keyTokens: number): number {
  const n = key.ids.length;
  if (n < 1 || n > keyTokens) return -1;
  const pool = key.poolFrom ?? 0;
  let h = Math.imul(n ^ (pool << 16), 0x9e3779b1);
  for (let i = 0; i < n; i++) {
    const w = keyWord(key, i);
    if (w < 0) return -1;
    h = Math.imul(h ^ w, 0x85ebca6b);
    h ^= h >>> 13;
  }
  h ^= h >>> 16;
  h = Math.imul(h, 0x7feb352d);
  h ^= h >>> 15;
  return h >>> 1;
}

/** Token i of a key as one word: id | type << 24; -1 when it does not fit. */
function keyWord(key: CacheKey, i: number): number {
  const id = key.ids[i]!;
  const type = key.typeIds ? key.typeIds[i]! : 0;
  if (id < 0 || id >= 1 << 24 || type < 0 || type >= 128) return -1;
  return id | (type << 24);
}

interface Region {
  /** First word of the region. */
  at: number;
  entry: number;
  width: number;
  keyTokens: number;
  /** Where the row starts within an entry. */
  rowAt: number;
}

export class ResultCache {
  readonly buffer: SharedArrayBuffer;
  readonly layout: CacheLayout;
  private readonly owner: number;
  private readonly words: Int32Array;
  private readonly floats: Float32Array;
  private readonly stats: Float64Array;
  private readonly regions: Region[];

  /** A new, empty table (all zero). */
  static create(layout: CacheLayout, owner = 0): ResultCache {
    return new ResultCache(new SharedArrayBuffer(cacheByteLength(layout)), layout, owner);
  }

  /** Maps a table another thread created, as `owner` (its statistics row and its lock mark). */
  constructor(buffer: SharedArrayBuffer, layout: CacheLayout, owner: number) {
    if (buffer.byteLength < cacheByteLength(layout)) throw new RangeError('result cache buffer is smaller than its layout');
    if (!(owner >= 0 && owner < layout.owners)) throw new RangeError(`owner ${owner} is not one of the cache's ${layout.owners}`);
    this.buffer = buffer;
    this.layout = layout;
    this.owner = owner;
    this.words = new Int32Array(buffer);
    this.floats = new Float32Array(buffer);
    const statsAt = statsWords(layout);
    this.stats = new Float64Array(buffer, 0, (statsAt * 4) / 8);
    let at = statsAt;
    this.regions = layout.models.map((m) => {
      const r = { at, entry: entryWords(m), width: m.width, keyTokens: m.keyTokens, rowAt: E_KEY + m.keyTokens };
      at += layout.sets * WAYS * r.entry;
      return r;
    });
  }

  /**
   * Copies the row cached for `key` of `model` into `out` at `offset` and
   * counts a hit; false (a miss, counted) when none is, or it is being written.
   * On a miss `out` may hold part of a row: the caller overwrites it.
   */
  get(model: number, key: CacheKey, out: Float32Array, offset: number): boolean {
    const r = this.regions[model]!;
    const hash = keyHash(key, r.keyTokens);
    if (hash >= 0 && this.find(r, hash, key, out, offset)) {
      this.count(model, S_HITS, 1);
      return true;
    }
    this.count(model, S_MISSES, 1);
    return false;
  }

  /** The set's entry holding `key`, copied into `out`; validated by the seqlock. */
  private find(r: Region, hash: number, key: CacheKey, out: Float32Array, offset: number): boolean {
    const w = this.words;
    const n = key.ids.length;
    const pool = key.poolFrom ?? 0;
    const set = r.at + (hash % this.layout.sets) * WAYS * r.entry;
    for (let way = 0; way < WAYS; way++) {
      const e = set + way * r.entry;
      const seq = Atomics.load(w, e + E_SEQ);
      if (seq & 1 || w[e + E_HASH] !== hash || w[e + E_LEN] !== n || w[e + E_POOL] !== pool) continue;
      if (!this.sameKey(e, key)) continue;
      const row = e + r.rowAt;
      out.set(this.floats.subarray(row, row + r.width), offset);
      if (Atomics.add(w, e + E_SEQ, 0) !== seq) continue; // rewritten while we read: not this entry's row
      const use = w[e + E_USE]!;
      if (use < USE_MAX) Atomics.store(w, e + E_USE, use + 1); // a lost increment under a race is harmless
      return true;
    }
    return false;
  }

  private sameKey(e: number, key: CacheKey): boolean {
    const w = this.words;
    for (let i = 0; i < key.ids.length; i++) if (w[e + E_KEY + i] !== keyWord(key, i)) return false;
    return true;
  }

  /**
   * Stores `row` (width floats of `rows` from `offset`) for `key` of `model`,
   * unless the key is there already, cannot be cached, or every candidate
   * entry is being written (then nothing is stored: a cache may forget).
   */
  put(model: number, key: CacheKey, rows: Float32Array, offset: number): void {
    const r = this.regions[model]!;
    const hash = keyHash(key, r.keyTokens);
    if (hash < 0) return;
    const set = r.at + (hash % this.layout.sets) * WAYS * r.entry;
    const victim = this.victim(r, set, hash, key);
    if (victim < 0) return;
    const w = this.words;
    if (Atomics.compareExchange(w, victim + E_LOCK, 0, 1 + this.owner) !== 0) return; // another writer took it first
    // Odd by a read-modify-write: one that follows a reader's check reads from it, so the reader's copy
    // happened before anything written below (see the header). Even before: only a lock holder changes it.
    const seq = Atomics.add(w, victim + E_SEQ, 1);
    const evicted = w[victim + E_LEN] !== 0;
    if (evicted) {
      this.count(model, S_EVICTIONS, 1);
      this.count(model, S_LIVE, -1);
    }
    const n = key.ids.length;
    w[victim + E_HASH] = hash;
    w[victim + E_LEN] = n;
    w[victim + E_POOL] = key.poolFrom ?? 0;
    w[victim + E_USE] = 1; // a new entry outranks one unused since the last eviction
    for (let i = 0; i < n; i++) w[victim + E_KEY + i] = keyWord(key, i);
    this.floats.set(rows.subarray(offset, offset + r.width), victim + r.rowAt);
    Atomics.store(w, victim + E_SEQ, seq + 2); // published: the key and row above are whole
    this.count(model, S_LIVE, 1);
    if (evicted) this.age(r, set, victim);
    Atomics.store(w, victim + E_LOCK, 0);
  }

  /** Where a new key goes in its set: the first empty entry, else the least used; -1 when the key is there already or all are locked. */
  private victim(r: Region, set: number, hash: number, key: CacheKey): number {
    const w = this.words;
    const n = key.ids.length;
    const pool = key.poolFrom ?? 0;
    let empty = -1;
    let best = -1;
    let bestUse = Infinity;
    for (let way = 0; way < WAYS; way++) {
      const e = set + way * r.entry;
      if (Atomics.load(w, e + E_LOCK) !== 0) continue; // being written (or its writer died): skip it
      const len = w[e + E_LEN]!;
      if (len === 0) {
        if (empty < 0) empty = e;
        continue;
      }
      if (len === n && w[e + E_HASH] === hash && w[e + E_POOL] === pool && this.sameKey(e, key)) return -1; // stored already
      const use = w[e + E_USE]!;
      if (use < bestUse) {
        best = e;
        bestUse = use;
      }
    }
    return empty >= 0 ? empty : best;
  }

  /** One eviction in the set: every other entry's USE less one. */
  private age(r: Region, set: number, except: number): void {
    const w = this.words;
    for (let way = 0; way < WAYS; way++) {
      const e = set + way * r.entry;
      const use = w[e + E_USE]!;
      if (e !== except && use > 0) Atomics.store(w, e + E_USE, use - 1);
    }
  }

  private count(model: number, field: number, by: number): void {
    this.stats[(this.owner * this.layout.models.length + model) * STATS + field]! += by;
  }

  /**
   * Frees the entries `owner` held locked when it died (call on the main
   * thread once that thread has exited, before its replacement starts): a
   * half-written one (SEQ odd) is emptied at a new version, a whole one kept.
   * Returns how many locks it freed.
   */
  reclaim(owner: number): number {
    const w = this.words;
    const mark = 1 + owner;
    let freed = 0;
    for (const r of this.regions) {
      const end = r.at + this.layout.sets * WAYS * r.entry;
      for (let e = r.at; e < end; e += r.entry) {
        if (Atomics.load(w, e + E_LOCK) !== mark) continue;
        const seq = Atomics.load(w, e + E_SEQ);
        if (seq & 1) {
          w[e + E_LEN] = 0;
          Atomics.store(w, e + E_SEQ, seq + 1); // a new version: a reader that began before sees it change
        }
        Atomics.store(w, e + E_LOCK, 0);
        freed++;
      }
    }
    return freed;
  }

  /** Whether `model` has a region here: the models of the start-up set do; a model loaded later (a new id) does not. */
  covers(model: number): boolean {
    return model < this.regions.length;
  }

  /** Whether `model` has any entry: a request for it may be answered without a slot. */
  holds(model: number): boolean {
    return this.sum(model, S_LIVE) > 0;
  }

  /** Every owner's counts for `model`, summed (read at scrape time). */
  statsOf(model: number): CacheStats {
    const r = this.regions[model]!;
    const entries = Math.max(0, this.sum(model, S_LIVE));
    return {
      hits: this.sum(model, S_HITS),
      misses: this.sum(model, S_MISSES),
      evictions: this.sum(model, S_EVICTIONS),
      entries,
      bytes: entries * r.entry * 4,
      capacityBytes: this.layout.sets * WAYS * r.entry * 4,
    };
  }

  private sum(model: number, field: number): number {
    const models = this.layout.models.length;
    let total = 0;
    for (let o = 0; o < this.layout.owners; o++) total += this.stats[(o * models + model) * STATS + field]!;
    return total;
  }
}

// ------------------------------------------------------------ one request's inputs

/** A request's inputs looked up: the rows found, in place (input i at i x width), and the inputs still to run. */
export interface Lookup {
  rows: Float32Array;
  missing: number[];
}

/** Looks up every input of a request of `model` (rows `width` wide). */
export function lookUp(cache: ResultCache, model: number, inputs: readonly CacheKey[], width: number): Lookup {
  const rows = new Float32Array(inputs.length * width);
  const missing: number[] = [];
  for (let i = 0; i < inputs.length; i++) if (!cache.get(model, inputs[i]!, rows, i * width)) missing.push(i);
  return { rows, missing };
}

/**
 * Stores the rows the model computed for the missing inputs (`ran`, in the
 * order of `look.missing`) and puts them in place; returns the request's rows.
 */
export function fillMissing(cache: ResultCache, model: number, inputs: readonly CacheKey[], look: Lookup, ran: Float32Array, width: number): Float32Array {
  const all = look.missing.length === inputs.length; // nothing hit: `ran` is the request's rows as they are
  look.missing.forEach((i, k) => {
    cache.put(model, inputs[i]!, ran, k * width);
    if (!all) look.rows.set(ran.subarray(k * width, (k + 1) * width), i * width);
  });
  return all ? ran : look.rows;
}
