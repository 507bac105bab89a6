/**
 * bench:quick's inputs: short texts generated from a seed and tokenized by
 * the model's tokenizer (every row sees the same ones), or, with --ids,
 * random token sequences.
 */
import { loadTokenizer } from '../../src/core/tokenizer/tokenizer.js';
import { bertUncasedVocab } from '../../models/generator/tokenizer-json.js';
import type { ModelSpec } from '../../src/shared/model-format/model-config.js';
import type { Workload } from '../workloads.js';

/** Tokens per sequence, [CLS] and [SEP] included. */
export const MIN_LEN = 8;
export const MAX_LEN = 32;

export interface Seq {
  ids: Int32Array;
  typeIds: Int32Array;
  text?: string;
}

const CLS = 101;
const SEP = 102;

const randInt = (r: () => number, lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));

/** [CLS] random ids in 1000..29000 [SEP], lengths uniform in MIN_LEN..MAX_LEN. */
export function tokenWorkload(r: () => number, n: number): Seq[] {
  return Array.from({ length: n }, () => {
    const len = randInt(r, MIN_LEN, MAX_LEN);
    const ids = new Int32Array(len);
    ids[0] = CLS;
    for (let i = 1; i < len - 1; i++) ids[i] = randInt(r, 1000, 29000);
    ids[len - 1] = SEP;
    return { ids, typeIds: new Int32Array(len) };
  });
}

/** Short English-looking texts from vocabulary words, kept when they tokenize to MIN_LEN..MAX_LEN tokens. */
export async function textWorkload(r: () => number, n: number, spec: ModelSpec): Promise<Seq[]> {
  const tokenizer = await loadTokenizer(spec.tokenizerPath);
  const vocab = bertUncasedVocab();
  const words = vocab.filter((t) => /^[a-z]{2,}$/.test(t));
  const pieces = vocab.filter((t) => /^##[a-z]{2,}$/.test(t)).map((t) => t.slice(2));
  const pick = <T>(xs: readonly T[]) => xs[Math.floor(r() * xs.length)]!;
  const out: Seq[] = [];
  while (out.length < n) {
    const target = randInt(r, MIN_LEN, MAX_LEN);
    const parts: string[] = [];
    for (let i = 0; i < Math.max(1, Math.round((target - 2) * 0.8)); i++) {
      let w = pick(words);
      if (r() < 0.15) w += pick(pieces);
      if (i === 0) w = w[0]!.toUpperCase() + w.slice(1);
      if (r() < 0.1) w += pick([',', ';', '.']);
      parts.push(w);
    }
    const text = parts.join(' ') + pick(['.', '?', '!']);
    const enc = tokenizer.encode(text, { maxLength: spec.maxLength, truncate: false });
    if (enc.ids.length < MIN_LEN || enc.ids.length > MAX_LEN) continue;
    out.push({ ids: enc.ids, typeIds: enc.typeIds, text });
  }
  return out;
}

/** The HTTP and WebSocket rows' requests: one text each, bodies serialized before timing. */
export function serverWorkload(seqs: Seq[]): Workload {
  return {
    name: 'short',
    description: 'quick.ts texts',
    requests: seqs.map((s) => [{ text: s.text!, ids: s.ids, typeIds: s.typeIds }]),
    bodies: seqs.map((s) => Buffer.from(JSON.stringify({ inputs: s.text }))),
    form: 'text',
  };
}
