/**
 * A WordPiece vocabulary's ASCII pieces in an open-addressing hash table keyed
 * by their characters, for wordpiece-ascii.ts: a lookup hashes text[from, to)
 * where it lies (no substring, no "##" + piece), probes one Int32Array and
 * compares characters in one Uint8Array.
 *
 * Why: Map lookups (token_to_id on a fresh substring: hash the new string,
 * walk the Map's buckets, compare with the key string elsewhere in the heap)
 * are a large share of a gateway thread's CPU under load, mostly cache misses
 * (docs/tokenizer.md, The ASCII fast path, has the profile).
 *
 * Word-initial pieces and continuation pieces (the prefix, "##", stripped) are
 * keyed apart: the FNV-1a hash starts from a different seed for each, so a
 * continuation is hashed from its first character like any other piece.
 */

/** FNV-1a's offset basis: the hash of a word-initial piece starts here. */
export const INITIAL_SEED = 0x811c9dc5 | 0;
/** Another start for continuation pieces, so "ing" and "##ing" hash apart. */
export const CONTINUATION_SEED = 0x5bd1e995 | 0;

/** Ints per slot of the table: hash, start, length and kind, id. */
const SLOT_INTS = 4;

/** One more character into an FNV-1a hash. */
export function hashStep(hash: number, charCode: number): number {
  return Math.imul(hash ^ charCode, 16777619);
}

export class PieceTable {
  /** Slot index mask (capacity - 1). */
  readonly #mask: number;
  /**
   * SLOT_INTS ints per slot, one cache line for four slots: the piece's hash, where its characters
   * start in #chars, its length << 1 | 1 for a continuation (0: an empty slot), and its id. A
   * lookup reads one slot line and one #chars line; parallel arrays would read five lines more,
   * and in a gateway under load, whose other work evicts them, cache misses are most of a lookup.
   */
  readonly #slots: Int32Array;
  readonly #chars: Uint8Array;
  /** The longest piece held, in characters. */
  readonly maxChars: number;

  /** `tokens`: every token with its id; a token starting with `prefix` also goes in as a continuation without it. Non-ASCII tokens are left out: ASCII text never matches them. */
  constructor(tokens: Iterable<readonly [string, number]>, prefix: string) {
    const pieces: { text: string; id: number; continuation: boolean }[] = [];
    for (const [token, id] of tokens) {
      if (!/^[\x00-\x7f]+$/.test(token)) continue;
      pieces.push({ text: token, id, continuation: false });
      if (prefix !== '' && token.startsWith(prefix) && token.length > prefix.length) pieces.push({ text: token.slice(prefix.length), id, continuation: true });
    }
    let capacity = 16;
    while (capacity < pieces.length * 1.6) capacity *= 2; // load at most 0.63: a probe rarely leaves its line
    this.#mask = capacity - 1;
    this.#slots = new Int32Array(capacity * SLOT_INTS);
    this.#chars = new Uint8Array(pieces.reduce((n, p) => n + p.text.length, 0));
    let at = 0;
    let maxChars = 0;
    for (const p of pieces) {
      let hash = p.continuation ? CONTINUATION_SEED : INITIAL_SEED;
      for (let i = 0; i < p.text.length; i++) {
        this.#chars[at + i] = p.text.charCodeAt(i);
        hash = hashStep(hash, p.text.charCodeAt(i));
      }
      // A piece the table holds already (a duplicate token) keeps its first id, as before.
      let slot = hash & this.#mask;
      while (this.#slots[slot * SLOT_INTS + 2] !== 0) slot = (slot + 1) & this.#mask;
      const s = slot * SLOT_INTS;
      this.#slots[s] = hash;
      this.#slots[s + 1] = at;
      this.#slots[s + 2] = (Math.min(p.text.length, 0xffff) << 1) | (p.continuation ? 1 : 0);
      this.#slots[s + 3] = p.id;
      at += p.text.length;
      maxChars = Math.max(maxChars, p.text.length);
    }
    this.maxChars = maxChars;
  }

  /** The id of the piece text[from, to) (`hash` its hash from the seed of its kind), or -1. */
  find(hash: number, text: string, from: number, to: number, continuation: boolean): number {
    const length = to - from;
    const meta = (length << 1) | (continuation ? 1 : 0);
    const slots = this.#slots;
    for (let slot = hash & this.#mask; ; slot = (slot + 1) & this.#mask) {
      const s = slot * SLOT_INTS;
      const m = slots[s + 2]!;
      if (m === 0) return -1;
      if (m !== meta || slots[s] !== hash) continue;
      const start = slots[s + 1]!;
      let i = 0;
      while (i < length && this.#chars[start + i] === text.charCodeAt(from + i)) i++;
      if (i === length) return slots[s + 3]!;
    }
  }
}
