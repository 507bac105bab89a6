/**
 * What a request gives the pipeline: its inputs (texts or token ids), how they
 * are cut, and the tokens one slot holds.
 */
import type { Encoding, TruncationDirection } from './tokenizer/tokenizer.js';

/** One input: a text, or token ids with the special tokens included (TEI's and OpenAI's pre-tokenized form). */
export type Input = string | number[];
/** One input, or a list of them. A flat list of numbers is ONE pre-tokenized input; a list of lists, several. */
export type Inputs = string | number[] | Input[];

/** Whether `inputs` is one input (a text or one list of token ids) rather than a list of inputs. */
export function isSingleInput(inputs: Inputs): inputs is string | number[] {
  return typeof inputs === 'string' || (Array.isArray(inputs) && inputs.length > 0 && typeof inputs[0] === 'number');
}

/** `inputs` as a list of inputs. */
export function inputList(inputs: Inputs): Input[] {
  return isSingleInput(inputs) ? [inputs] : (inputs as Input[]);
}

/** How many inputs (slots) a request holds. */
export function inputCount(inputs: Inputs): number {
  return isSingleInput(inputs) ? 1 : Array.isArray(inputs) ? inputs.length : 0;
}

/** Whether an input longer than the model's max length is cut (else refused, 413), and on which side. */
export interface Truncation {
  truncate: boolean;
  direction?: TruncationDirection | undefined;
  /** Tokens an input may have, where fewer than the model's max length (a ColBERT query's). */
  maxLength?: number | undefined;
}

/** What one request runs, one input per slot. */
export type CallInputs =
  /** Texts and/or pre-tokenized ids (TEI's /embed and /predict, OpenAI's input). */
  | {
      kind: 'inputs';
      inputs: readonly Input[];
      truncate: boolean;
      direction?: TruncationDirection | undefined;
      /** Tokens an input may have, where fewer than the model's max length (Cohere's max_tokens, vLLM's truncate_prompt_tokens). */
      maxLength?: number | undefined;
      /** Leading tokens of each text input the pooling leaves out: its prompt's (prompts.ts, include_prompt false). */
      poolFrom?: number | undefined;
      /** A ColBERT model's inputs: marked, cut and expanded as PyLate does for this type (core/colbert.ts). */
      colbert?: ColbertInputType | undefined;
      /** Inputs longer than the model takes run as windows, their rows combined (long-inputs.ts); `truncate` then does not apply. */
      chunk?: ChunkPolicy | undefined;
    }
  /** (query, text) pairs for a cross-encoder: one query for every text, or one per text. */
  | {
      kind: 'pairs';
      queries: readonly string[];
      texts: readonly string[];
      truncate: boolean;
      /** Tokens a pair may have, where fewer than the model's max length (vLLM's truncate_prompt_tokens). */
      maxLength?: number | undefined;
      /** The most tokens of a query and of a text kept (their first ones) before the pair is cut to its length: Cohere's max_tokens_per_doc, vLLM's max_tokens_per_query and _per_doc. */
      maxQueryTokens?: number | undefined;
      maxTextTokens?: number | undefined;
      /** Texts too long for the query beside them run as windows, the best one's score kept (long-inputs.ts). */
      chunk?: ChunkPolicy | undefined;
    }
  /** Tokens built outside the tokenizer (KServe tensors), checked against the model's limits here. */
  | {
      kind: 'tokens';
      tokens: readonly Tokens[];
      /** Sequences longer than the model takes run as windows (late chunking's one text: long-inputs.ts). */
      chunk?: ChunkPolicy | undefined;
    };

/** Which side of a ColBERT model an input is: queries and documents are marked and cut apart (colbert.ts). */
export type ColbertInputType = 'query' | 'document';

/** How a request's long inputs are chunked (long-inputs.ts). */
export interface ChunkPolicy {
  /** Most tokens one input may have in all, special tokens included (--max-input-tokens); past it, 413. */
  maxInputTokens: number;
  /** Text tokens each window repeats of the one before (--chunk-overlap-tokens); at most half a window's. */
  overlap: number;
  /** Most windows of one document (Cohere's max_chunks_per_doc): the rest of it is cut. Absent: as many as it takes. */
  maxWindows?: number | undefined;
}

/** Token ids (special tokens included) and their type ids: what one slot holds. */
export type Tokens = Pick<Encoding, 'ids'> & {
  typeIds: Int32Array | null;
  /** Leading tokens the pooling leaves out (a prompt's, include_prompt false); default 0. */
  poolFrom?: number;
  /** Leading tokens the attention sees, where fewer than all (ColBERT's query expansion); default all. */
  attended?: number;
};
