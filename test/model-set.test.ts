/**
 * src/main/repository/model-set.ts: ids, what new requests may find (serving), and the reuse of an unloaded
 * model's slab buffer (a new Slab laid out in it starts as a fresh one would).
 */
import { describe, expect, it } from 'vitest';
import { ModelSet } from '../dist/src/main/repository/model-set.js';
import type { ModelPlan } from '../dist/src/shared/model-plan.js';
import { H_LENGTH, Slab, SlotState } from '../dist/src/shared/slab.js';

const LAYOUT = { slotCount: 4, maxLength: 8, outputWidth: 3, owners: 2 };

function plan(index: number, name: string, reuse?: SharedArrayBuffer): ModelPlan {
  const slab = Slab.create(LAYOUT, reuse);
  return { index, spec: { name } as ModelPlan['spec'], batching: {} as ModelPlan['batching'], maxLength: 8, capacities: [], slab: slab.buffer, layout: slab.layout };
}

describe('ModelSet', () => {
  it('serves the newest version of each name, less the retired; ids are never reused', () => {
    const set = new ModelSet([plan(0, 'a'), plan(1, 'b')]);
    set.add(plan(2, 'a')); // a reload of a
    expect(set.serving().map((p) => p.index)).toEqual([1, 2]);
    set.retire(1);
    expect(set.serving().map((p) => p.index)).toEqual([2]);
    expect(set.plans().map((p) => p.index)).toEqual([0, 1, 2]); // the old versions are still supervised
    set.remove(0);
    expect(set.nextId()).toBe(3);
    expect(set.slabs[0]).toBeUndefined();
  });

  it("reuses an unloaded model's buffer for a slab of the same size, zeroed and initialised", () => {
    const set = new ModelSet([plan(0, 'a')]);
    const used = set.slab(0)!;
    const slot = used.free.pop();
    used.transition(slot, SlotState.FREE, SlotState.FILLING);
    used.setHeader(slot, H_LENGTH, 7);
    used.slotIds(slot).fill(42);
    const buffer = set.plans()[0]!.slab;
    set.remove(0);
    expect(set.reusable(buffer.byteLength + 8)).toBeUndefined(); // another size: not this one
    const again = set.reusable(buffer.byteLength);
    expect(again).toBe(buffer);
    expect(set.reusable(buffer.byteLength)).toBeUndefined(); // taken once
    const fresh = Slab.create(LAYOUT, again);
    expect(fresh.buffer).toBe(buffer);
    expect(fresh.free.size()).toBe(LAYOUT.slotCount);
    for (let s = 0; s < LAYOUT.slotCount; s++) {
      expect(fresh.state(s)).toBe(SlotState.FREE);
      expect(fresh.header(s, H_LENGTH)).toBe(0);
      expect(Array.from(fresh.slotIds(s))).toEqual(Array(LAYOUT.maxLength).fill(0));
    }
  });
});
