/**
 * Tokenize and validate: a request's inputs become the tokens its slots hold.
 * Texts are tokenized on this thread when small (--inline-tokenize-chars), on
 * the tokenizer pool when large; token ids sent as they are (pre-tokenized
 * inputs, KServe tensors) are checked against the model's limits, so nothing
 * out of range reaches the device.
 */
import { colbertTextLength, markColbert, markDocumentWindows } from './colbert.js';
import type { Cancellation } from './cancel.js';
import type { CallInputs, ChunkPolicy, ColbertInputType, Input, Tokens, Truncation } from './inputs.js';
import { chunkedTooLong, splitAll, tryChunked, type Around, type Windowed } from './long-inputs.js';
import type { ServedModel } from './served-model.js';
import type { EncodeOptions, Encoding, TruncationDirection } from './tokenizer/tokenizer.js';
import { InputTooLongError, ValidationError } from '../shared/errors.js';

/**
 * Tokenizes a list of texts off the event loop (a piscina pool); absent, batches are tokenized inline.
 * Rejects with OverloadedError when its queue is full, CancelledError when `cancel` fires while the
 * texts still wait their turn.
 */
export type BatchTokenizer = (model: ServedModel, texts: string[], opts: EncodeOptions, cancel?: Cancellation) => Promise<Encoding[]>;

const COLBERT_TEXTS = 'a ColBERT model takes texts, not token ids: the server puts in its query and document markers';

/** Pairs tokenized inline yield the event loop after this many ms of work. */
const YIELD_EVERY_MS = 4;

export interface EncoderOptions {
  /** Where large client batches are tokenized; absent, inline. */
  batchTokenizer?: BatchTokenizer | undefined;
  /** Client batches of at most this many characters (at the library's pace) are tokenized inline. */
  inlineTokenizeChars: number;
}

export class Encoder {
  constructor(private readonly options: EncoderOptions) {}

  /** Whether large client batches go to a tokenizer pool. */
  get pooled(): boolean {
    return this.options.batchTokenizer !== undefined;
  }

  /**
   * The inline rule: the texts' characters at the library's pace (TextTokenizer.paceChars: an
   * eighth for ASCII the fast path takes) are at most --inline-tokenize-chars. Counted plainly
   * first: a request within the bound by its length needs no closer look.
   */
  fitsInline(model: ServedModel, list: readonly unknown[]): boolean {
    let chars = 0;
    for (const x of list) if (typeof x === 'string') chars += x.length;
    if (chars <= this.options.inlineTokenizeChars) return true;
    chars = 0;
    for (const x of list) if (typeof x === 'string') chars += model.tokenizer.paceChars(x);
    return chars <= this.options.inlineTokenizeChars;
  }

  /** The tokens of a request's inputs: synchronous when they are tokenized inline or already tokens. */
  tokenize(model: ServedModel, inputs: CallInputs, cancel: Cancellation | undefined): Tokens[] | Promise<Tokens[]> {
    switch (inputs.kind) {
      case 'inputs': {
        if (inputs.colbert) return this.colbertTokens(model, inputs.inputs, inputs.colbert, inputs.direction, cancel);
        const encoded = this.encodeInputs(model, inputs.inputs, inputs, cancel);
        if (!inputs.poolFrom) return encoded;
        const mark = (e: Encoding[]) => poolingFrom(inputs.inputs, e, inputs.poolFrom!, inputs.direction);
        return encoded instanceof Promise ? encoded.then(mark) : mark(encoded);
      }
      case 'pairs':
        return this.encodePairs(model, inputs.queries, inputs.texts, inputs.truncate, inputs);
      case 'tokens':
        this.checkTokens(model, inputs.tokens);
        return inputs.tokens as Tokens[];
    }
  }

  /** A ColBERT model's texts, cut to their type's length (always, as PyLate does), marked and a query expanded. */
  private colbertTokens(model: ServedModel, inputs: readonly Input[], kind: ColbertInputType, direction: TruncationDirection | undefined, cancel: Cancellation | undefined): Tokens[] | Promise<Tokens[]> {
    if (inputs.some((x) => typeof x !== 'string')) throw new ValidationError(COLBERT_TEXTS);
    const c = model.plan.spec.colbert!;
    const maxLength = colbertTextLength(c, kind, model.plan.maxLength);
    const encoded = this.encodeTexts(model, inputs as string[], { truncate: true, direction, maxLength }, cancel);
    const mark = (list: Encoding[]) => list.map((e) => markColbert(e, c, kind, model.plan.maxLength));
    return encoded instanceof Promise ? encoded.then(mark) : mark(encoded);
  }

  /**
   * Validates and tokenizes texts: inline when small, on the batch tokenizer (if any) when large.
   * `cancel` drops texts still waiting for the batch tokenizer (the client went away).
   */
  encodeTexts(model: ServedModel, texts: readonly string[], cut: Truncation, cancel?: Cancellation): Encoding[] | Promise<Encoding[]> {
    if (texts.length === 0) throw new ValidationError('inputs must be a string or a non-empty list of strings');
    for (const t of texts) {
      if (typeof t !== 'string') throw new ValidationError('every input must be a string');
      if (t.length === 0) throw new ValidationError('inputs must not be empty strings');
    }
    const opts = { maxLength: cut.maxLength ?? model.plan.maxLength, truncate: cut.truncate, direction: cut.direction };
    const inline = this.fitsInline(model, texts);
    if (texts.length === 1 && inline) return [model.tokenizer.encode(texts[0]!, opts)];
    if (this.options.batchTokenizer && !inline) return this.options.batchTokenizer(model, texts as string[], opts, cancel);
    return model.tokenizer.encodeBatch(texts as string[], opts);
  }

  /**
   * {@link encodeTexts}, also taking pre-tokenized inputs (token ids with the
   * special tokens, checked by {@link encodeIds}, not tokenized): what the
   * HTTP APIs accept as `inputs` / `input`.
   */
  encodeInputs(model: ServedModel, list: readonly Input[], cut: Truncation, cancel?: Cancellation): Encoding[] | Promise<Encoding[]> {
    if (list.length === 0) throw new ValidationError('inputs must be a string, a list of token ids, or a non-empty list of those');
    let texts = 0;
    for (const x of list) if (typeof x === 'string') texts++;
    if (texts === list.length) return this.encodeTexts(model, list as string[], cut, cancel);
    const out: Encoding[] = new Array(list.length);
    const textList: string[] = [];
    const at: number[] = [];
    list.forEach((x, i) => {
      if (typeof x === 'string') {
        textList.push(x);
        at.push(i);
      } else if (Array.isArray(x)) {
        out[i] = this.encodeIds(model, x, cut);
      } else {
        throw new ValidationError('every input must be a string or a list of token ids');
      }
    });
    if (textList.length === 0) return out;
    const fill = (encoded: Encoding[]) => {
      encoded.forEach((e, k) => (out[at[k]!] = e));
      return out;
    };
    const encoded = this.encodeTexts(model, textList, cut, cancel);
    return encoded instanceof Promise ? encoded.then(fill) : fill(encoded);
  }

  /**
   * One pre-tokenized input: token ids as the model takes them, special tokens
   * ([CLS] ... [SEP]) included, as TEI takes them. Every id must be an integer
   * in [0, vocabulary size). Longer than the model's max length: refused, or
   * with `truncate` cut to it: the last ids go, a final [SEP] with them (or,
   * with direction left, the first ids, a [CLS] with them: the ids are taken
   * as sent). Type ids are all 0.
   */
  encodeIds(model: ServedModel, ids: ArrayLike<number>, cut: Truncation): Encoding {
    if (!Array.isArray(ids) && !ArrayBuffer.isView(ids)) throw new ValidationError('token ids must be a list of integers');
    const n = ids.length;
    if (n === 0) throw new ValidationError('a token sequence must not be empty');
    const max = model.plan.maxLength;
    if (n > max && !cut.truncate) throw new InputTooLongError(n, max);
    const keep = Math.min(n, max);
    const from = cut.direction === 'left' ? n - keep : 0;
    const vocab = model.tokenizer.vocabSize;
    const out = new Int32Array(keep);
    for (let i = 0; i < keep; i++) {
      const id = ids[from + i];
      if (typeof id !== 'number' || !Number.isInteger(id) || id < 0 || id >= vocab) {
        throw new ValidationError(`token id ${JSON.stringify(id)} at position ${from + i} is not an integer in [0, ${vocab})`);
      }
      out[i] = id;
    }
    return { ids: out, typeIds: new Int32Array(keep), truncated: keep < n };
  }

  /**
   * Checks token sequences built outside the tokenizer (pre-tokenized
   * inputs, KServe tensors) against the model's limits: length, ids within
   * the vocabulary, type ids within the model's token types. Nothing out of
   * range may reach the device: an out-of-range id would fail the whole
   * batch, other requests' inputs with it.
   */
  checkTokens(model: ServedModel, encodings: readonly (Pick<Encoding, 'ids'> & { typeIds?: Int32Array | null })[], maxLength = model.plan.maxLength): void {
    if (encodings.length === 0) throw new ValidationError('inputs must not be empty');
    const vocab = model.tokenizer.vocabSize;
    const types = model.plan.spec.typeVocabSize ?? 2;
    for (const e of encodings) {
      if (e.ids.length === 0) throw new ValidationError('a token sequence must not be empty');
      if (e.ids.length > maxLength) throw new InputTooLongError(e.ids.length, maxLength);
      for (let i = 0; i < e.ids.length; i++) {
        const id = e.ids[i]!;
        if (id < 0 || id >= vocab) throw new ValidationError(`token id ${id} at position ${i} is not in [0, ${vocab})`);
      }
      if (e.typeIds) {
        if (e.typeIds.length !== e.ids.length) throw new ValidationError('token type ids must be as many as the token ids');
        for (let i = 0; i < e.typeIds.length; i++) {
          const t = e.typeIds[i]!;
          if (t < 0 || t >= types) throw new ValidationError(`token type id ${t} at position ${i} is not in [0, ${types})`);
        }
      }
    }
  }

  /**
   * Tokenizes (query, text) pairs for a cross-encoder: [CLS] query [SEP] text
   * [SEP], type ids 0 then 1; too long and `truncate`: longest_first. One
   * query for every text, or one per text. Inline, yielding the event loop
   * every few ms on long lists.
   */
  async encodePairs(
    model: ServedModel,
    queries: readonly string[],
    texts: readonly string[],
    truncate: boolean,
    cut: { maxLength?: number | undefined; maxQueryTokens?: number | undefined; maxTextTokens?: number | undefined } = {},
  ): Promise<Encoding[]> {
    const tok = model.tokenizer;
    if (!tok.encodePair) throw new ValidationError(`model "${model.plan.spec.name}"'s tokenizer cannot encode pairs`);
    const opts = { maxLength: Math.min(cut.maxLength ?? Infinity, model.plan.maxLength), truncate, maxFirst: cut.maxQueryTokens, maxSecond: cut.maxTextTokens };
    return mapPairs(queries, texts, (q, t) => tok.encodePair!(q, t, opts));
  }

  /**
   * Pairs as windows (long-inputs.ts): each text too long for its query beside
   * it cut into consecutive windows, the query whole in each (at most
   * `policy.maxWindows` of them).
   */
  async pairWindows(model: ServedModel, inputs: Extract<CallInputs, { kind: 'pairs' }>, policy: ChunkPolicy): Promise<Windowed> {
    const tok = model.tokenizer;
    if (!tok.encodePairWindows) throw new ValidationError(`model "${model.plan.spec.name}"'s tokenizer cannot cut pairs into windows`);
    const opts = {
      maxLength: Math.min(inputs.maxLength ?? Infinity, model.plan.maxLength),
      maxInputTokens: policy.maxInputTokens,
      overlap: policy.overlap,
      maxWindows: policy.maxWindows,
      maxSecond: inputs.maxTextTokens,
    };
    const lists = await mapPairs(inputs.queries, inputs.texts, (q, t) => tok.encodePairWindows!(q, t, opts)).catch(chunkedTooLong(policy));
    const from = new Int32Array(lists.length + 1);
    lists.forEach((l, i) => (from[i + 1] = from[i]! + l.length));
    return { tokens: lists.flat(), from, whole: lists.map((l) => l[0]!), around: tok.around ?? { lead: 0, trail: 0 }, overlap: policy.overlap };
  }

  /**
   * Texts and ids as windows (long-inputs.ts): texts tokenized whole, up to
   * `policy.maxInputTokens` (413 past it), then each one longer than the model
   * takes cut into windows. Token ids are taken as sent: never cut. A
   * ColBERT document's windows are of its document length, each marked.
   */
  inputWindows(model: ServedModel, inputs: Extract<CallInputs, { kind: 'inputs' }>, policy: ChunkPolicy, cancel: Cancellation | undefined): Windowed | Promise<Windowed> {
    const around = aroundOf(model);
    const document = inputs.colbert === 'document';
    if (document && inputs.inputs.some((x) => typeof x !== 'string')) throw new ValidationError(COLBERT_TEXTS);
    const whole = { ...inputs, colbert: undefined, chunk: undefined, truncate: false, maxLength: policy.maxInputTokens };
    const split = document ? (t: Tokens[]) => this.documentWindows(model, t, around, policy) : (t: Tokens[]) => splitAll(t, model.plan.maxLength, around, policy);
    const tokens = tryChunked(() => this.tokenize(model, whole, cancel), policy);
    return tokens instanceof Promise ? tokens.then(split, chunkedTooLong(policy)) : split(tokens);
  }

  /** A ColBERT model's documents (tokenized unmarked) as windows of its document length, each marked as one document. */
  private documentWindows(model: ServedModel, tokens: Tokens[], around: Around, policy: ChunkPolicy): Windowed {
    const c = model.plan.spec.colbert!;
    const textLength = colbertTextLength(c, 'document', model.plan.maxLength);
    return markDocumentWindows(splitAll(tokens, textLength, around, policy), c, model.plan.maxLength);
  }

  /** Tokens built outside the tokenizer (late chunking's one text) as windows: checked up to `policy.maxInputTokens`, then cut. */
  tokenWindows(model: ServedModel, tokens: readonly Tokens[], policy: ChunkPolicy): Windowed {
    const around = aroundOf(model);
    tryChunked(() => this.checkTokens(model, tokens, policy.maxInputTokens), policy);
    return splitAll(tokens, model.plan.maxLength, around, policy);
  }
}

/** The special tokens around one text of `model`'s tokenizer, which each window repeats. */
function aroundOf(model: ServedModel): Around {
  const around = model.tokenizer.around;
  if (!around) throw new ValidationError(`model "${model.plan.spec.name}"'s tokenizer cannot say its special tokens, which windows repeat`);
  return around;
}

/** `encode` over each (query, text) pair, checked: one query for every text, or one per text. Yields the event loop every few ms. */
async function mapPairs<T>(queries: readonly string[], texts: readonly string[], encode: (query: string, text: string) => T): Promise<T[]> {
  if (queries.length !== 1 && queries.length !== texts.length) throw new ValidationError(`${queries.length} queries for ${texts.length} texts: give one, or one per text`);
  for (const q of queries) if (typeof q !== 'string' || q.length === 0) throw new ValidationError('query must be a non-empty string');
  if (texts.length === 0) throw new ValidationError('texts must be a non-empty list of strings');
  for (const t of texts) {
    if (typeof t !== 'string' || t.length === 0) throw new ValidationError('every text must be a non-empty string');
  }
  const out: T[] = new Array(texts.length);
  let slice = performance.now();
  for (let i = 0; i < texts.length; i++) {
    out[i] = encode(queries.length === 1 ? queries[0]! : queries[i]!, texts[i]!);
    if (performance.now() - slice > YIELD_EVERY_MS && i + 1 < texts.length) {
      await new Promise<void>((resolve) => setImmediate(resolve));
      slice = performance.now();
    }
  }
  return out;
}

/**
 * The encodings with the first `poolFrom` tokens of each text input left out
 * of the pooling (token-id inputs are taken as sent: pooled whole). A text cut
 * on the left has lost the start of its prompt, and what is left of it is not
 * known here: refused.
 */
function poolingFrom(inputs: readonly Input[], encoded: Encoding[], poolFrom: number, direction: TruncationDirection | undefined): Tokens[] {
  return encoded.map((e, i) => {
    if (typeof inputs[i] !== 'string') return e;
    if (e.truncated && direction === 'left') {
      throw new ValidationError('truncation_direction left would cut the prompt this model pools without (include_prompt false): truncate on the right, or send a shorter text');
    }
    return { ids: e.ids, typeIds: e.typeIds, poolFrom };
  });
}
