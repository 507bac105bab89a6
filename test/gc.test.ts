/**
 * src/shared/gc.ts: a thread's start-up garbage is collected when it asks, not when V8's memory
 * reducer would (the CLI turns that off; bench/suite/idle.ts measures what it saves).
 */
import { describe, expect, it } from 'vitest';
import { collectStartupGarbage } from '../dist/src/shared/gc.js';

describe('collectStartupGarbage', () => {
  it('collects what nothing references any more, at once', async () => {
    let garbage: { bytes: ArrayBuffer } | undefined = { bytes: new ArrayBuffer(16 << 20) };
    const ref = new WeakRef(garbage);
    garbage = undefined;
    // A WeakRef keeps its target alive to the end of the job that made or read it.
    await new Promise((resolve) => setImmediate(resolve));
    collectStartupGarbage();
    expect(ref.deref()).toBeUndefined();
    collectStartupGarbage(); // again: the same collector, no new flag
  });
});
