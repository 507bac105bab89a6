import { once } from 'node:events';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { IndexQueue } from '../dist/src/shared/index-queue.js';

const fixture = new URL('./fixtures/queue-worker.mjs', import.meta.url);

function makeQueue(capacity: number, start = 0) {
  const buffer = new SharedArrayBuffer(IndexQueue.byteLength(capacity));
  const q = new IndexQueue(buffer, 0, capacity);
  q.init(start);
  return { buffer, q };
}

describe('IndexQueue, one thread', () => {
  it('is FIFO, refuses when full and answers -1 when empty', () => {
    const { q } = makeQueue(4);
    expect(q.pop()).toBe(-1);
    for (const v of [7, 8, 9, 10]) expect(q.push(v)).toBe(true);
    expect(q.push(11)).toBe(false);
    expect(q.size()).toBe(4);
    expect([q.pop(), q.pop(), q.pop(), q.pop(), q.pop()]).toEqual([7, 8, 9, 10, -1]);
  });

  it('keeps working across the int32 wrap-around of its positions', () => {
    const { q } = makeQueue(8, 2 ** 31 - 5);
    const out: number[] = [];
    for (let round = 0; round < 10; round++) {
      for (let i = 0; i < 5; i++) expect(q.push(round * 10 + i)).toBe(true);
      for (let i = 0; i < 5; i++) out.push(q.pop());
    }
    expect(out).toEqual(Array.from({ length: 50 }, (_, k) => Math.floor(k / 5) * 10 + (k % 5)));
    expect(q.pop()).toBe(-1);
  });

  it('rounds capacity up to a power of two and rejects nonsense', () => {
    expect(makeQueue(5).q.capacity).toBe(8);
    expect(() => makeQueue(0)).toThrow(RangeError);
  });
});

describe('IndexQueue across threads', () => {
  async function run(producers: number, consumers: number, perProducer: number, capacity: number) {
    const buffer = new SharedArrayBuffer(IndexQueue.byteLength(capacity));
    new IndexQueue(buffer, 0, capacity).init();
    const maxValue = producers * 1_000_000;
    const seen = new SharedArrayBuffer(maxValue * 4);
    const done = new SharedArrayBuffer(4);
    const common = { buffer, capacity, count: perProducer, seen, done, producers };
    const cons = Array.from({ length: consumers }, (_, id) => new Worker(fixture, { workerData: { ...common, role: 'consumer', id } }));
    const prods = Array.from({ length: producers }, (_, id) => new Worker(fixture, { workerData: { ...common, role: 'producer', id } }));
    // Listen for exits now: a producer may finish before the consumers report.
    const exited = [...cons, ...prods].map((w) => once(w, 'exit'));
    // once() rejects on the worker's 'error' event, so a crashed thread fails the test instead of hanging it.
    const received = await Promise.all(cons.map(async (w) => (await once(w, 'message'))[0] as number));
    await Promise.all(exited);
    return { tally: new Int32Array(seen), received };
  }

  it('4 producers, 1 consumer: every index arrives exactly once', { timeout: 60_000 }, async () => {
    const per = 5_000;
    const { tally, received } = await run(4, 1, per, 64);
    expect(received).toEqual([4 * per]);
    for (let p = 0; p < 4; p++) {
      for (let i = 0; i < per; i++) {
        if (tally[p * 1_000_000 + i] !== 1) throw new Error(`value ${p}:${i} seen ${tally[p * 1_000_000 + i]} times`);
      }
    }
  });

  it('3 producers, 2 consumers (the free list): no loss, no duplicate', { timeout: 60_000 }, async () => {
    const per = 4_000;
    const { tally, received } = await run(3, 2, per, 32);
    expect(received.reduce((a, b) => a + b, 0)).toBe(3 * per);
    let total = 0;
    for (let p = 0; p < 3; p++) {
      for (let i = 0; i < per; i++) {
        const n = tally[p * 1_000_000 + i]!;
        if (n !== 1) throw new Error(`value ${p}:${i} seen ${n} times`);
        total += n;
      }
    }
    expect(total).toBe(3 * per);
  });
});
