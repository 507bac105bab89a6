/**
 * The suite's workloads (short, mixed, client-batch: bench/README.md), drawn
 * from a fixed seed out of the bert-base-uncased vocabulary and tokenized by
 * the model's own tokenizer before timing, so every input's length is known.
 */
import { loadTokenizer, type TextTokenizer } from '../src/core/tokenizer/tokenizer.js';
import { bucketFor, defaultBuckets } from '../src/gpu-worker/scheduler.js';
import { bertUncasedVocab } from '../models/generator/tokenizer-json.js';
import { mulberry32 } from '../models/generator/rng.js';
import type { ModelSpec } from '../src/shared/model-format/model-config.js';
import type { WorkloadSummary } from './suite-results.js';

export type WorkloadName = 'short' | 'mixed' | 'client-batch';

/** One input: its text and the ids the model's tokenizer makes of it. */
export interface Input {
  text: string;
  ids: Int32Array;
  typeIds: Int32Array;
}

export interface Workload {
  /** A WorkloadName, or a case's own (cache's `repeated`, outputs' routes). */
  name: string;
  /** The route the bodies go to (default /embed). */
  path?: string;
  description: string;
  /** requests[i] holds the inputs of request i (one, or a client batch). */
  requests: Input[][];
  /** JSON bodies for POST /embed, serialized once, before any timing. */
  bodies: Buffer[];
  /** What is sent: the texts (the server tokenizes), or their token ids (pre-tokenized, as TEI takes them). */
  form: 'text' | 'ids';
}

export const WORKLOAD_DESCRIPTIONS: Record<WorkloadName, string> = {
  short: 'one text per request, 8-32 tokens',
  mixed: 'one text per request, 8-512 tokens, log-normal (median ~24, long tail)',
  'client-batch': '16 short texts (8-32 tokens) per request',
};

const MIN_TOKENS = 8;
const SHORT_MAX = 32;
const CLIENT_BATCH = 16;

const randInt = (r: () => number, lo: number, hi: number) => lo + Math.floor(r() * (hi - lo + 1));

/** Standard normal from two uniforms (Box-Muller). */
function normal(r: () => number): number {
  return Math.sqrt(-2 * Math.log(1 - r())) * Math.cos(2 * Math.PI * r());
}

/** The words and the word pieces (without ##) of the bert-base-uncased vocabulary, what the generated texts are made of. */
export function vocabulary(): { words: string[]; pieces: string[] } {
  const vocab = bertUncasedVocab();
  return {
    words: vocab.filter((t) => /^[a-z]{2,}$/.test(t)),
    pieces: vocab.filter((t) => /^##[a-z]{2,}$/.test(t)).map((t) => t.slice(2)),
  };
}

/** Builds English-looking texts out of vocabulary words and word pieces. */
class TextMaker {
  private readonly v = vocabulary();

  constructor(private readonly r: () => number) {}

  private pick<T>(xs: readonly T[]): T {
    return xs[Math.floor(this.r() * xs.length)]!;
  }

  /** About `tokens` tokens of text (a word is ~1.25 tokens once pieces and punctuation count). */
  text(tokens: number): string {
    const parts: string[] = [];
    const words = Math.max(1, Math.round((tokens - 2) * 0.8));
    for (let i = 0; i < words; i++) {
      let w = this.pick(this.v.words);
      if (this.r() < 0.15) w += this.pick(this.v.pieces);
      if (i === 0) w = w[0]!.toUpperCase() + w.slice(1);
      if (this.r() < 0.1) w += this.pick([',', ';', '.']);
      parts.push(w);
    }
    return parts.join(' ') + this.pick(['.', '?', '!']);
  }
}

/** Draws inputs whose token count comes from `target` and is kept only within [MIN_TOKENS, max]. */
function drawInputs(n: number, max: number, target: () => number, maker: TextMaker, tok: TextTokenizer, maxLength: number): Input[] {
  const out: Input[] = [];
  while (out.length < n) {
    const text = maker.text(target());
    const enc = tok.encode(text, { maxLength: 1 << 20, truncate: false });
    if (enc.ids.length < MIN_TOKENS || enc.ids.length > Math.min(max, maxLength)) continue;
    out.push({ text, ids: enc.ids, typeIds: enc.typeIds });
  }
  return out;
}

/** Generates one workload for `spec`'s tokenizer; the same seed gives the same texts. */
export async function makeWorkload(name: WorkloadName, spec: ModelSpec, seed: number, requests: number): Promise<Workload> {
  const r = mulberry32(seed ^ hash(name));
  const tok = await loadTokenizer(spec.tokenizerPath);
  const maker = new TextMaker(r);
  const max = spec.maxLength;
  let reqs: Input[][];
  if (name === 'short') {
    reqs = drawInputs(requests, SHORT_MAX, () => randInt(r, MIN_TOKENS, SHORT_MAX), maker, tok, max).map((i) => [i]);
  } else if (name === 'mixed') {
    // log-normal: exp(ln 24 + 1.1 z) tokens, so most are short and a few are near the limit
    const target = () => Math.min(max, Math.max(MIN_TOKENS, Math.round(Math.exp(Math.log(24) + 1.1 * normal(r)))));
    reqs = drawInputs(requests, max, target, maker, tok, max).map((i) => [i]);
  } else {
    const flat = drawInputs(requests * CLIENT_BATCH, SHORT_MAX, () => randInt(r, MIN_TOKENS, SHORT_MAX), maker, tok, max);
    reqs = Array.from({ length: requests }, (_, i) => flat.slice(i * CLIENT_BATCH, (i + 1) * CLIENT_BATCH));
  }
  return { name, description: WORKLOAD_DESCRIPTIONS[name], requests: reqs, bodies: reqs.map((inputs) => jsonBody(requestInputs(inputs, 'text'))), form: 'text' };
}

/** The same workload sent as token ids ([CLS] ... [SEP] included), so the server does not tokenize. */
export function preTokenized(w: Workload): Workload {
  return { ...w, bodies: w.requests.map((inputs) => jsonBody(requestInputs(inputs, 'ids'))), form: 'ids' };
}

/** A request's `inputs` field: one input alone, several as a list; texts, or ids as plain number lists. */
export function requestInputs(inputs: Input[], form: Workload['form']): string | number[] | (string | number[])[] {
  const one = (x: Input) => (form === 'text' ? x.text : Array.from(x.ids));
  return inputs.length === 1 ? one(inputs[0]!) : inputs.map(one);
}

const jsonBody = (inputs: unknown) => Buffer.from(JSON.stringify({ inputs }));

function hash(s: string): number {
  let h = 2166136261;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 16777619);
  return h >>> 0;
}

function quantile(sorted: number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
}

/** Token statistics and shares per default bucket, for the report. */
export function summarizeWorkload(w: Workload, maxLength: number): WorkloadSummary {
  const lengths = w.requests.flat().map((i) => i.ids.length).sort((a, b) => a - b);
  const buckets = defaultBuckets(maxLength);
  const shares: Record<string, number> = {};
  for (const len of lengths) {
    const b = String(buckets[bucketFor(buckets, len)]);
    shares[b] = (shares[b] ?? 0) + 1 / lengths.length;
  }
  for (const k of Object.keys(shares)) shares[k] = Math.round(shares[k]! * 1000) / 1000;
  return {
    name: w.name,
    description: w.description,
    requests: w.requests.length,
    inputsPerRequest: w.requests[0]!.length,
    tokens: {
      min: lengths[0]!,
      p50: quantile(lengths, 0.5),
      mean: Math.round((lengths.reduce((a, b) => a + b, 0) / lengths.length) * 10) / 10,
      p90: quantile(lengths, 0.9),
      p99: quantile(lengths, 0.99),
      max: lengths[lengths.length - 1]!,
    },
    bucketShares: shares,
  };
}

/** Inputs and tokens of request i. */
export function requestSize(w: Workload, i: number): { inputs: number; tokens: number } {
  const req = w.requests[i]!;
  let tokens = 0;
  for (const x of req) tokens += x.ids.length;
  return { inputs: req.length, tokens };
}
