/**
 * src/main/repository/model-budget.ts on its own: which loaded models make room for a load (least recently used
 * first; never a busy or a pinned one), with fake slabs (rows moved, slots taken).
 */
import { describe, expect, it } from 'vitest';
import { BudgetError, ModelBudget, type BudgetModel } from '../dist/src/main/repository/model-budget.js';
import { Counter, type Slab } from '../dist/src/shared/slab.js';

/** A clock the test moves by hand. */
function clock(): { now: () => number; advance: (ms: number) => void } {
  let t = 1_000_000;
  return { now: () => t, advance: (ms) => void (t += ms) };
}

const MIB = 2 ** 20;

/** A slab as the budget reads it: rows computed, slots free of `slots`. */
function fakeSlab(slots = 4): Slab & { rows(n: number): void; take(n: number): void } {
  const counters = new Float64Array(16);
  let free = slots;
  return {
    counters,
    free: { size: () => free },
    layout: { slotCount: slots },
    rows: (n: number) => (counters[Counter.ROWS] = counters[Counter.ROWS]! + n),
    take: (n: number) => (free -= n),
  } as unknown as Slab & { rows(n: number): void; take(n: number): void };
}

const model = (name: string, memoryMb = 10) => ({ name, slab: fakeSlab(), memoryBytes: memoryMb * MIB }) satisfies BudgetModel;

describe('ModelBudget.makeRoom', () => {
  it('unloads the least recently used first, as many as the count needs', () => {
    const c0 = clock();
    const budget = new ModelBudget({ maxLoadedModels: 2, pinned: [] }, c0.now);
    const [a, b, c] = [model('a'), model('b'), model('c')];
    for (const m of [a, b, c]) budget.lastUsed(m);
    c0.advance(5);
    a.slab.rows(3); // a ran rows since: used now
    const victims = budget.makeRoom([a, b, c], { name: 'd', memoryBytes: MIB });
    expect(victims.map((v) => v.name)).toEqual(['b', 'c']); // 3 loaded + 1 of 2 allowed: two go, a stays
  });

  it('unloads until the memory fits, and never a busy or a pinned model', () => {
    const c0 = clock();
    const budget = new ModelBudget({ modelMemoryMb: 35, pinned: ['p'] }, c0.now);
    const [p, busy, old, newer] = [model('p'), model('busy'), model('old'), model('newer')];
    busy.slab.take(1);
    budget.lastUsed(old);
    c0.advance(5);
    budget.lastUsed(newer);
    // 40 MiB loaded, 10 more asked: 15 must go, two models of 10: old, then newer.
    expect(budget.makeRoom([p, busy, old, newer], { name: 'x', memoryBytes: 10 * MIB }).map((v) => v.name)).toEqual(['old', 'newer']);
    expect(() => budget.makeRoom([p, busy], { name: 'x', memoryBytes: 20 * MIB })).toThrow(BudgetError);
    expect(() => budget.makeRoom([p, busy], { name: 'x', memoryBytes: 20 * MIB })).toThrow(/busy \(holds a request\) or pinned/);
    expect(() => budget.makeRoom([], { name: 'huge', memoryBytes: 40 * MIB })).toThrow(/needs about 40 MiB, more than --model-memory-mb 35 allows/);
  });

  it('idle(): past the limit, not pinned, not busy', () => {
    const c0 = clock();
    const budget = new ModelBudget({ idleUnloadS: 0.02, pinned: ['p'] }, c0.now);
    const [p, busy, quiet, working] = [model('p'), model('busy'), model('quiet'), model('working')];
    for (const m of [p, busy, quiet, working]) budget.lastUsed(m);
    busy.slab.take(1);
    c0.advance(19);
    expect(budget.idle([p, busy, quiet, working])).toEqual([]); // not yet
    c0.advance(11);
    working.slab.rows(1);
    expect(budget.idle([p, busy, quiet, working]).map((m) => m.name)).toEqual(['quiet']);
  });
});
