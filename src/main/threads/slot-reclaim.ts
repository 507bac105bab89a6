/**
 * Slots a dead thread left behind, given back on the main thread: those an
 * inference thread held (answered, their queue tallies taken back), and those
 * a gateway thread had queued, reserved or was filling (cancelled or freed).
 * Used by the inference supervisor (src/main/threads/inference-supervisor.ts) and the gateway
 * supervision (src/main/server.ts).
 */
import { bucketFor } from '../../shared/batching.js';
import type { ControlBlock } from '../../shared/control.js';
import type { ModelPlan } from '../../shared/model-plan.js';
import { Account, Counter, H_ERROR, H_GENERATION, H_HOLDER, H_LENGTH, H_OWNER, holderMark, Slab, SlotError, SlotState } from '../../shared/slab.js';
/**
 * Answers every request the inference thread of `epoch` held (queued in its
 * scheduler, or in a batch) and every request on a submit ring with 503
 * (SlotError.RESTARTED onto its owner's completion queue), frees the cancelled
 * ones (the inference side sees them last), and takes them off the queued
 * tallies admission reads. Returns how many were answered.
 *
 * Call only after the thread was given up (control.nextEpoch()): it then
 * touches no slot. Which slots it held comes from H_HOLDER; the generation is
 * read before and after it so a slot freed and taken again meanwhile (the
 * owner resets H_HOLDER and sets H_OWNER before bumping the generation) is
 * left alone. A queued or running slot cannot be freed by anyone but the
 * inference side, so once seen it stays ours until answered.
 */
export function reclaimInference(plans: ModelPlan[], slabs: Slab[], control: ControlBlock, epoch: number): number {
  let answered = 0;
  const owners = new Set<number>();
  plans.forEach((plan) => {
    const slab = slabs[plan.index]!;
    const buckets = plan.batching.buckets;
    const unqueue = (slot: number) => {
      const b = bucketFor(buckets, slab.header(slot, H_LENGTH));
      if (b < 0) return;
      Atomics.sub(slab.accounts, Account.QUEUED_TOKENS, buckets[b]!);
      Atomics.sub(slab.accounts, Account.QUEUED_BY_BUCKET + b, 1);
    };
    /** QUEUED | RUNNING -> FAILED onto its owner's queue; CANCELLED -> FREE. `counted`: still in the queued tallies. */
    const end = (slot: number, counted: boolean) => {
      for (;;) {
        const state = slab.state(slot);
        if (state === SlotState.QUEUED || state === SlotState.RUNNING) {
          slab.setHeader(slot, H_ERROR, SlotError.RESTARTED);
          if (slab.transition(slot, state, SlotState.FAILED) !== state) continue; // its owner cancelled it meanwhile
          if (counted) unqueue(slot);
          const owner = slab.header(slot, H_OWNER);
          slab.completions[owner]!.push(slot);
          owners.add(owner);
          answered++;
          return;
        }
        if (state === SlotState.CANCELLED) {
          if (slab.transition(slot, state, SlotState.FREE) !== state) continue;
          if (counted) unqueue(slot);
          slab.counters[Counter.CANCELLED_SKIPPED]! += 1;
          slab.freeSlot(slot);
          return;
        }
        return; // FREE, FILLING, DONE, FAILED: not the inference side's
      }
    };
    // On the ring: never taken by any inference thread, still in the tallies.
    for (let slot = slab.submit.pop(); slot !== -1; slot = slab.submit.pop()) end(slot, true);
    // Taken by the given-up thread: in its queues (still in the tallies) or dequeued (in a batch).
    const queued = holderMark(epoch, false);
    const dequeued = holderMark(epoch, true);
    for (let slot = 0; slot < slab.layout.slotCount; slot++) {
      const generation = slab.header(slot, H_GENERATION);
      const holder = slab.header(slot, H_HOLDER);
      if (holder !== queued && holder !== dequeued) continue;
      const state = slab.state(slot);
      if (state !== SlotState.QUEUED && state !== SlotState.RUNNING && state !== SlotState.CANCELLED) continue;
      if (slab.header(slot, H_GENERATION) !== generation) continue; // freed and taken again since
      end(slot, holder === queued);
    }
    slab.counters[Counter.QUEUED] = 0;
    slab.counters[Counter.BUSY_UNTIL] = 0;
  });
  control.inflightBatches = 0;
  control.runStartedAt = 0;
  for (const owner of owners) control.ownerBell(owner).ring();
  return answered;
}

/**
 * Frees what a dead owner thread (a gateway) held, once it has exited: its
 * queued and running requests are cancelled (the inference thread frees them
 * when it meets them), its finished ones, on its completion queue, are freed.
 * Returns the slots it was filling when it died: free them with
 * {@link freeStuckFilling} a moment later (a live owner fills a slot in
 * microseconds; one still FILLING with the same generation then is stuck).
 */
export function reclaimOwner(slabs: Slab[], owner: number): { cancelled: number; freed: number; filling: { model: number; slot: number; generation: number }[] } {
  let cancelled = 0;
  let freed = 0;
  const filling: { model: number; slot: number; generation: number }[] = [];
  slabs.forEach((slab, model) => {
    for (let slot = 0; slot < slab.layout.slotCount; slot++) {
      const generation = slab.header(slot, H_GENERATION);
      if (slab.header(slot, H_OWNER) !== owner) continue;
      const state = slab.state(slot);
      if (slab.header(slot, H_GENERATION) !== generation) continue; // taken by another owner since
      if (state === SlotState.QUEUED || state === SlotState.RUNNING) {
        if (slab.transition(slot, state, SlotState.CANCELLED) === state) cancelled++;
      } else if (state === SlotState.FILLING) {
        filling.push({ model, slot, generation });
      }
    }
    // Finished before (or while) we cancelled: on its completion queue. The owner is gone: free them for it.
    const queue = slab.completions[owner]!;
    for (let slot = queue.pop(); slot !== -1; slot = queue.pop()) {
      const state = slab.state(slot);
      if ((state === SlotState.DONE || state === SlotState.FAILED) && slab.transition(slot, state, SlotState.FREE) === state) {
        slab.freeSlot(slot);
        freed++;
      }
    }
  });
  return { cancelled, freed, filling };
}

/** Frees slots a dead owner left FILLING (from {@link reclaimOwner}) that are still FILLING with the same generation. */
export function freeStuckFilling(slabs: Slab[], owner: number, filling: { model: number; slot: number; generation: number }[]): number {
  let freed = 0;
  for (const f of filling) {
    const slab = slabs[f.model]!;
    if (slab.header(f.slot, H_OWNER) !== owner || slab.header(f.slot, H_GENERATION) !== f.generation) continue;
    if (slab.transition(f.slot, SlotState.FILLING, SlotState.FREE) === SlotState.FILLING) {
      slab.freeSlot(f.slot);
      freed++;
    }
  }
  return freed;
}
