/**
 * The models this process serves right now, on the main thread: each plan
 * with its slab, by id. The supervisors read it when they start a thread (a
 * replacement gets the current set), metrics and /info when they are asked;
 * the model repository (src/main/repository/repository.ts) adds and removes models.
 *
 * A model's id is its plan's index: its slab's identity in every thread. Ids
 * are never reused, so a slot, a completion or a message naming an id can
 * only mean that one version of that one model; a reload is a new id.
 * Per-model arrays across the code are indexed by id (and so may have holes
 * once a model is unloaded); lists of plans are dense, in id order.
 */
import type { ModelPlan } from '../../shared/model-plan.js';
import { Slab } from '../../shared/slab.js';

/** How many released slab buffers are kept for reuse. */
const KEPT_BUFFERS = 4;

export class ModelSet {
  private readonly entries = new Map<number, { plan: ModelPlan; slab: Slab; retired: boolean }>();
  /** Slabs by id, holes where no model is (the shape src/main/threads/slot-reclaim.ts and the submitters take). */
  readonly slabs: Slab[] = [];
  private nextIdValue = 0;
  /** Slab buffers of unloaded models, newest last, for reuse (at most KEPT_BUFFERS). */
  private readonly released: SharedArrayBuffer[] = [];

  constructor(plans: ModelPlan[] = []) {
    for (const p of plans) this.add(p);
  }

  /** The id the next plan made should take. */
  nextId(): number {
    return this.nextIdValue;
  }

  add(plan: ModelPlan): void {
    if (this.entries.has(plan.index)) throw new Error(`model id ${plan.index} is taken`);
    const slab = new Slab(plan.slab, plan.layout);
    this.entries.set(plan.index, { plan, slab, retired: false });
    this.slabs[plan.index] = slab;
    this.nextIdValue = Math.max(this.nextIdValue, plan.index + 1);
  }

  /**
   * Forgets model `id`. Call once no thread touches its slab any more (an unload's end): its buffer
   * is kept for a later model of the same size (reusable()). A SharedArrayBuffer's memory comes back
   * only once every thread's heap has been collected, which V8 does late for a buffer it sees as
   * small: without reuse the RSS grows over load/unload cycles, far less with a GC forced after
   * each (docs/model-repository.md has the figures).
   */
  remove(id: number): void {
    const e = this.entries.get(id);
    this.entries.delete(id);
    delete this.slabs[id];
    if (!e) return;
    this.released.push(e.plan.slab);
    if (this.released.length > KEPT_BUFFERS) this.released.shift();
  }

  /** A released slab buffer of exactly `bytes`, taken out of the set's keeping; undefined if none. */
  reusable(bytes: number): SharedArrayBuffer | undefined {
    const at = this.released.findIndex((b) => b.byteLength === bytes);
    return at < 0 ? undefined : this.released.splice(at, 1)[0];
  }

  /** No new request may find model `id` (it is being unloaded): a gateway started from now on is not given it. */
  retire(id: number): void {
    const e = this.entries.get(id);
    if (e) e.retired = true;
  }

  /** What new requests may find: the newest version of each name, less those being unloaded; in id order. */
  serving(): ModelPlan[] {
    const newest = new Map<string, ModelPlan>();
    for (const p of this.plans()) newest.set(p.spec.name, p);
    return [...newest.values()].filter((p) => !this.entries.get(p.index)!.retired).sort((a, b) => a.index - b.index);
  }

  /** Every plan, in id order (the order models were loaded in), those on their way out included. */
  plans(): ModelPlan[] {
    return [...this.entries.values()].map((e) => e.plan).sort((a, b) => a.index - b.index);
  }

  /** The newest version of `name` (during a reload the old one is still here, finishing what it holds). */
  byName(name: string): ModelPlan | undefined {
    let found: ModelPlan | undefined;
    for (const e of this.entries.values()) if (e.plan.spec.name === name && (!found || e.plan.index > found.index)) found = e.plan;
    return found;
  }

  slab(id: number): Slab | undefined {
    return this.entries.get(id)?.slab;
  }
}
