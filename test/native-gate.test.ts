/**
 * The native gate (src/shared/native-gate.ts): a thread is never terminated
 * while inside a native call. The cell's counting and sealing in this thread;
 * then, in child processes (an abort must not take the test runner along), a
 * worker inside a real onnxruntime run ended both ways: terminate() aborts the
 * process (the hazard the gate exists for), the gated ending waits for the run
 * and the process lives.
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { AbandonedError, callsInside, FAMILY_CELLS, NativeGate, newFamily, seal, sealCells, SessionCells } from '../dist/src/shared/native-gate.js';

const FIXTURE = fileURLToPath(new URL('./fixtures/native-call-terminate.mjs', import.meta.url));
const MODEL = fileURLToPath(new URL('../models/tiny-embed/model.onnx', import.meta.url));

/** A call that settles when the test says. */
function deferred(): { promise: Promise<string>; resolve: (v: string) => void; reject: (e: Error) => void } {
  let resolve!: (v: string) => void;
  let reject!: (e: Error) => void;
  const promise = new Promise<string>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/** Seals `indices` of `family` (sealCells); `done()` says whether it has finished. */
function sealing(family: SharedArrayBuffer, indices?: number[]): { done: () => boolean; finished: Promise<void> } {
  let finished = false;
  const p = sealCells(family, indices).then(() => {
    finished = true;
  });
  return { done: () => finished, finished: p };
}

describe('NativeGate', () => {
  it('sealing refuses new calls at once, without making them, and finishes once every call in progress has returned', async () => {
    const family = newFamily();
    const gate = new NativeGate(family, 0);
    const first = deferred();
    const second = deferred();
    const a = gate.run(() => first.promise);
    const b = gate.run(() => second.promise);
    expect(callsInside(family, [0])).toEqual([0]);
    const sealed = sealing(family, [0]);
    let called = 0;
    // From the seal on no call starts, even while two are still inside (else a busy thread would never be sealed).
    await expect(gate.run(async () => ++called)).rejects.toBeInstanceOf(AbandonedError);
    expect(() => gate.runSync(() => ++called)).toThrow(AbandonedError);
    expect(called).toBe(0);
    first.resolve('a');
    expect(await a).toBe('a');
    expect(callsInside(family, [0])).toEqual([0]); // the second call is still inside: the seal waits on
    expect(sealed.done()).toBe(false);
    second.resolve('b');
    expect(await b).toBe('b');
    expect(callsInside(family, [0])).toEqual([]);
    await sealed.finished;
  });

  it('a call that fails leaves the cell as it found it', async () => {
    const family = newFamily();
    const gate = new NativeGate(family, 3);
    const call = deferred();
    const running = gate.run(() => call.promise);
    call.reject(new Error('onnxruntime failed'));
    await expect(running).rejects.toThrow('onnxruntime failed');
    expect(() => gate.runSync(() => {
      throw new Error('koffi failed');
    })).toThrow('koffi failed');
    expect(callsInside(family, [3])).toEqual([]);
    await sealCells(family, [3]); // nothing inside: sealed at once
    await expect(gate.run(async () => 1)).rejects.toBeInstanceOf(AbandonedError);
  });

  it('sealing some cells leaves the others working; sealing the family seals every cell', async () => {
    const family = newFamily();
    const own = new NativeGate(family, 0);
    const session = new NativeGate(family, 5);
    await sealCells(family, [5]);
    await expect(session.run(async () => 1)).rejects.toBeInstanceOf(AbandonedError);
    expect(await own.run(async () => 'still open')).toBe('still open');
    const inside = deferred();
    const running = own.run(() => inside.promise);
    seal(family);
    expect(callsInside(family)).toEqual([0]); // the family waits on cell 0 alone
    const sealed = sealing(family);
    inside.resolve('done');
    await running;
    await sealed.finished;
    for (const index of [0, 1, 5, FAMILY_CELLS - 1]) expect(() => new NativeGate(family, index).runSync(() => 1)).toThrow(AbandonedError);
  });

  it('cells are numbered within the family', () => {
    const family = newFamily();
    expect(() => new NativeGate(family, FAMILY_CELLS)).toThrow(RangeError);
    expect(() => new NativeGate(family, -1)).toThrow(RangeError);
    expect(() => new NativeGate(family, 1.5)).toThrow(RangeError);
  });
});

describe('SessionCells', () => {
  it('hands out every cell but the inference thread\'s, each once at a time, and takes back those whose thread ended', () => {
    const cells = new SessionCells(newFamily());
    const taken = Array.from({ length: FAMILY_CELLS - 1 }, () => cells.take().index);
    expect(new Set(taken).size).toBe(FAMILY_CELLS - 1);
    expect(taken).not.toContain(0);
    expect(Math.min(...taken)).toBe(1);
    expect(() => cells.take()).toThrow(`more than ${FAMILY_CELLS - 1} session threads at once`);
    cells.give(new NativeGate(cells.family, 17));
    expect(cells.take().index).toBe(17);
  });
});

describe('a worker inside onnxruntime\'s run, ended from another thread (child processes)', () => {
  const end = (mode: 'plain' | 'gated') => spawnSync(process.execPath, [FIXTURE, MODEL, mode], { encoding: 'utf8', timeout: 60_000 });

  it('terminate() aborts the whole process: the hazard', { timeout: 70_000 }, () => {
    const r = end('plain');
    expect(r.stdout).toContain('inside'); // it was ended during a run
    expect(r.stdout).not.toContain('ended');
    expect({ status: r.status, signal: r.signal }).toEqual({ status: null, signal: 'SIGABRT' });
    expect(r.stderr).toContain('Napi::Error');
  });

  it('terminateOutsideNativeCalls() waits for the run to return: the worker ends, the process lives', { timeout: 70_000 }, () => {
    const r = end('gated');
    expect(r.stdout.split('\n').filter(Boolean)).toEqual(['inside', 'ended']);
    expect({ status: r.status, signal: r.signal, stderr: r.stderr }).toEqual({ status: 0, signal: null, stderr: '' });
  });
});
