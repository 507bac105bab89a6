/**
 * OpenAI's token ids on /v1/embeddings: integer inputs there are tiktoken's
 * `cl100k_base` ids (what LangChain Python's `OpenAIEmbeddings` sends by
 * default, tokenizing each text with tiktoken before the call), decoded back
 * to the text they spell, which the model then embeds as any text. The served
 * model's own ids are taken only when the body says so
 * (`"token_encoding": "model"`).
 *
 * The vocabulary (js-tiktoken's ranks, about 1 MB) is read the first time a
 * gateway thread needs it, about half a second once, never at start-up.
 */
import { createRequire } from 'node:module';
import { Tiktoken, type TiktokenBPE } from 'js-tiktoken/lite';
import { FieldValidationError } from '../../shared/errors.js';

const require = createRequire(import.meta.url);

/** Ids of cl100k_base's byte-pair ranks: [0, RANKS). */
const RANKS = 100_256;

let encoding: Tiktoken | null = null;
let specials: ReadonlySet<number> = new Set();

/** The encoding, made on first use (synchronously: the body parsers are). */
function cl100k(): Tiktoken {
  if (encoding) return encoding;
  const mod = require('js-tiktoken/ranks/cl100k_base') as TiktokenBPE | { default: TiktokenBPE };
  const ranks = 'default' in mod ? mod.default : mod;
  specials = new Set(Object.values(ranks.special_tokens));
  encoding = new Tiktoken(ranks);
  return encoding;
}

/** Whether `id` is a cl100k_base id: a rank, or one of its special tokens (<|endoftext|>, ...). */
function isCl100kId(id: number): boolean {
  return (id >= 0 && id < RANKS) || specials.has(id);
}

/**
 * `inputs` with every list of token ids replaced by the text it decodes to as
 * cl100k_base (strings as they are). An id outside cl100k_base is a 400 naming it.
 */
export function decodeCl100k(inputs: readonly (string | readonly number[])[]): string[] {
  if (inputs.every((x) => typeof x === 'string')) return inputs as string[];
  const enc = cl100k();
  return inputs.map((x, i) => {
    if (typeof x === 'string') return x;
    for (const id of x) {
      if (!isCl100kId(id)) {
        throw new FieldValidationError(`input ${i}: token id ${id} is not a cl100k_base id (integer inputs are OpenAI's tiktoken ids; send "token_encoding": "model" for the model's own ids)`, 'input');
      }
    }
    return enc.decode(x as number[]);
  });
}
