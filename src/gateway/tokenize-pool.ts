/**
 * The gateway's tokenizer pool (piscina): large client batches are tokenized
 * here, off the event loop; single short texts stay inline, where they are
 * cheaper than the hop (docs/tokenizer.md has the figures).
 */
import { Piscina } from 'piscina';
import { InputTooLongError } from '../shared/errors.js';
import type { BatchTokenizer } from './inference-client.js';
import type { TokenizeResult, TokenizeTask } from './tokenize-task.js';
import type { Encoding } from './tokenizer.js';

export function createTokenizePool(threads: number): { tokenize: BatchTokenizer; warmUp(paths: string[]): Promise<void>; close(): Promise<void> } {
  const pool = new Piscina<TokenizeTask, TokenizeResult>({
    filename: new URL('./tokenize-task.js', import.meta.url).href,
    minThreads: threads,
    maxThreads: threads,
    idleTimeout: 60_000,
  });
  const tokenize: BatchTokenizer = async (model, texts, opts) => {
    const r = await pool.run({ tokenizerPath: model.plan.spec.tokenizerPath, texts, maxLength: opts.maxLength, truncate: opts.truncate });
    if ('tooLong' in r) throw new InputTooLongError(r.tooLong.length, r.tooLong.maxLength);
    const out: Encoding[] = [];
    let at = 0;
    for (let i = 0; i < r.lengths.length; i++) {
      const n = r.lengths[i]!;
      out.push({ ids: r.ids.subarray(at, at + n), typeIds: r.typeIds.subarray(at, at + n), truncated: r.truncated[i] === 1 });
      at += n;
    }
    return out;
  };
  return {
    tokenize,
    // Loads each tokenizer in the pool threads before the first request needs it.
    async warmUp(paths) {
      await Promise.all(paths.flatMap((p) => Array.from({ length: threads }, () => pool.run({ tokenizerPath: p, texts: ['warm up'], maxLength: 16, truncate: true }))));
    },
    close: () => pool.destroy(),
  };
}
