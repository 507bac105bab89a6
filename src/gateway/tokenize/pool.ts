/**
 * The gateway's tokenizer pool (piscina): large client batches are tokenized
 * here, off the event loop; single short texts stay inline, where they are
 * cheaper than the hop (docs/tokenizer.md has the figures).
 *
 * The queue in front of the pool threads is ours, not piscina's, and bounded:
 * at most one task per thread runs in piscina; past that, up to `maxQueue`
 * requests wait here in arrival order, and a request that finds the queue full
 * is refused at once (OverloadedError: 429) instead of waiting behind work it
 * cannot see the end of. A waiting request whose client goes away (its
 * cancellation) leaves the queue without costing a pool thread anything; one
 * already running finishes (piscina would terminate the thread to stop it,
 * and the next task would pay for a new one and its tokenizer load).
 */
import { Piscina } from 'piscina';
import type { Cancellation } from '../../core/cancel.js';
import { CancelledError, EngineClosedError, InputTooLongError, OverloadedError } from '../../shared/errors.js';
import type { BatchTokenizer } from '../../core/encoder.js';
import type { TokenizeResult, TokenizeTask } from './task.js';
import type { EncodeOptions, Encoding } from '../../core/tokenizer/tokenizer.js';

/**
 * Requests that may wait for a pool thread, per thread, by default: one
 * WebSocket may have 256 requests in flight (--ws-max-inflight), and such a
 * burst is served, not refused. A long text takes about a millisecond to
 * tokenize (docs/tokenizer.md), so 256 waiting requests of a few long texts
 * are well under a second of queue per thread; a pile-up of large lists past
 * that is refused at once rather than left to reach the device after its
 * deadline. (Requests wait here already holding their slots, so
 * --slots-per-model bounds the queue too.)
 */
export const TOKENIZER_QUEUE_PER_THREAD = 256;

/**
 * A pool thread idle this long exits; the next batch that needs one starts it
 * again. A thread costs tens of MB of RSS (its V8 heap and its tokenizer
 * copies: docs/tuning.md, Memory) and a fraction of a second to start (its
 * first batch waits for it: docs/tokenizer.md), so a gateway whose requests
 * stay inline never pays the memory, and one that tokenizes a large batch now
 * and then pays the start at most every few minutes.
 */
export const TOKENIZER_IDLE_MS = 300_000;

export interface TokenizePool {
  tokenize: BatchTokenizer;
  close(): Promise<void>;
  /** Requests tokenizing now, and waiting for a thread. */
  readonly running: number;
  readonly waiting: number;
}

export function createTokenizePool(threads: number, opts: { maxQueue?: number } = {}): TokenizePool {
  const maxQueue = opts.maxQueue ?? TOKENIZER_QUEUE_PER_THREAD * threads;
  // minThreads 0: no thread starts with the gateway; the first batch that needs one starts it, and idle ones exit.
  const pool = new Piscina<TokenizeTask, TokenizeResult>({
    filename: new URL('./task.js', import.meta.url).href,
    minThreads: 0,
    maxThreads: threads,
    idleTimeout: TOKENIZER_IDLE_MS,
  });
  let running = 0;
  /** Requests waiting for a thread, oldest first. */
  const waiting: { start: () => void; leave: (err: Error) => void }[] = [];

  const next = () => {
    const w = waiting.shift();
    if (w) w.start();
  };

  const runTask = async (task: TokenizeTask): Promise<Encoding[]> => {
    running++;
    try {
      return decode(await pool.run(task));
    } finally {
      running--;
      next();
    }
  };

  const tokenize: BatchTokenizer = (model, texts, encodeOpts: EncodeOptions, cancel?: Cancellation) => {
    if (cancel?.cancelled) return Promise.reject(new CancelledError('the client went away before its texts were tokenized'));
    const { tokenizerPath, lowercase } = model.plan.spec;
    const task: TokenizeTask = { tokenizerPath, lowercase, texts, maxLength: encodeOpts.maxLength, truncate: encodeOpts.truncate, direction: encodeOpts.direction };
    if (running < threads && waiting.length === 0) return runTask(task);
    if (waiting.length >= maxQueue) {
      return Promise.reject(new OverloadedError(`the tokenizer pool already has ${maxQueue} requests waiting (${threads} thread${threads === 1 ? '' : 's'}); retry shortly`));
    }
    return new Promise<Encoding[]>((resolve, reject) => {
      const leave = (err: Error) => {
        cancel?.unlisten(onAbort);
        const i = waiting.indexOf(entry);
        if (i >= 0) waiting.splice(i, 1);
        reject(err);
      };
      const onAbort = () => leave(new CancelledError('the client went away while its texts waited for the tokenizer pool'));
      const entry = {
        start: () => {
          cancel?.unlisten(onAbort);
          runTask(task).then(resolve, reject);
        },
        leave,
      };
      cancel?.listen(onAbort);
      waiting.push(entry);
    });
  };

  return {
    tokenize,
    async close() {
      for (const w of [...waiting]) w.leave(new EngineClosedError('the gateway closed before these texts were tokenized'));
      await pool.destroy();
    },
    get running() {
      return running;
    },
    get waiting() {
      return waiting.length;
    },
  };
}

/** A pool result as encodings (views into its flat arrays), or the error it stands for. */
function decode(r: TokenizeResult): Encoding[] {
  if ('tooLong' in r) throw new InputTooLongError(r.tooLong.length, r.tooLong.maxLength);
  const out: Encoding[] = [];
  let at = 0;
  for (let i = 0; i < r.lengths.length; i++) {
    const n = r.lengths[i]!;
    out.push({ ids: r.ids.subarray(at, at + n), typeIds: r.typeIds.subarray(at, at + n), truncated: r.truncated[i] === 1 });
    at += n;
  }
  return out;
}
