/**
 * The model budget (docs/model-repository.md, The budget): how many models may
 * be loaded at once and how much memory they may take together, and how long
 * a model may sit idle before it is unloaded. The repository asks it which
 * models to unload to make room for a load (the least recently used ones that
 * hold no request and are not pinned) and which ones have idled too long.
 *
 * A model is used when its slab's rows moved or it holds a slot: the main
 * thread reads that from shared memory (no message per request), each time it
 * decides and on a timer.
 */
import { Counter, type Slab } from '../../shared/slab.js';

export interface BudgetOptions {
  /** Most models loaded at once (--max-loaded-models); absent: no limit. */
  maxLoadedModels?: number;
  /** Most memory the loaded models take together, MiB (--model-memory-mb): each one's measured footprint; absent: no limit. */
  modelMemoryMb?: number;
  /** A model idle this long is unloaded (--model-idle-unload-s); absent: never. */
  idleUnloadS?: number;
  /** Models never unloaded by the budget or for idling (--pin-model). */
  pinned: readonly string[];
}

/** A loaded model as the budget sees it. */
export interface BudgetModel {
  name: string;
  slab: Slab;
  /** Its measured footprint, or an estimate until measured (the graph's size and the slab's). */
  memoryBytes: number;
}

export class ModelBudget {
  readonly opts: BudgetOptions;
  /** Per model name: when it was last seen used, and the rows its slab had then. */
  private readonly seen = new Map<string, { at: number; rows: number }>();

  /** `now`: the clock it judges idleness by (ms; tests pass their own). */
  constructor(
    opts: BudgetOptions,
    private readonly now: () => number = Date.now,
  ) {
    this.opts = opts;
  }

  /** Whether any limit is set (else nothing is ever evicted). */
  get active(): boolean {
    return this.opts.maxLoadedModels !== undefined || this.opts.modelMemoryMb !== undefined || this.opts.idleUnloadS !== undefined;
  }

  /** Marks `name` used now (a load, a request that waited for it). */
  touch(name: string, slab: Slab): void {
    this.seen.set(name, { at: this.now(), rows: slab.counters[Counter.ROWS]! });
  }

  /** Forgets an unloaded model. */
  forget(name: string): void {
    this.seen.delete(name);
  }

  /** When `m` was last used: now if it holds a slot or ran rows since last looked at. */
  lastUsed(m: BudgetModel, now = this.now()): number {
    const rows = m.slab.counters[Counter.ROWS]!;
    const s = this.seen.get(m.name);
    if (!s || s.rows !== rows || busy(m.slab)) {
      this.seen.set(m.name, { at: now, rows });
      return now;
    }
    return s.at;
  }

  /**
   * Which of `loaded` to unload so that one more model of `adding` bytes fits: least recently used
   * first, never one that holds a request or is pinned. Throws with the reason when they cannot.
   */
  makeRoom(loaded: BudgetModel[], adding: { name: string; memoryBytes: number }): BudgetModel[] {
    const maxModels = this.opts.maxLoadedModels ?? Infinity;
    const maxBytes = (this.opts.modelMemoryMb ?? Infinity) * 2 ** 20;
    if (adding.memoryBytes > maxBytes) {
      throw new BudgetError(`model ${adding.name} needs about ${mib(adding.memoryBytes)} MiB, more than --model-memory-mb ${this.opts.modelMemoryMb} allows for all models`);
    }
    const now = this.now();
    const candidates = loaded
      .filter((m) => !this.opts.pinned.includes(m.name) && !busy(m.slab))
      .sort((a, b) => this.lastUsed(a, now) - this.lastUsed(b, now));
    const out: BudgetModel[] = [];
    let count = loaded.length;
    let bytes = loaded.reduce((n, m) => n + m.memoryBytes, 0);
    while (count + 1 > maxModels || bytes + adding.memoryBytes > maxBytes) {
      const victim = candidates.shift();
      if (!victim) {
        const why = count + 1 > maxModels ? `--max-loaded-models ${maxModels} are loaded` : `the loaded models take ${mib(bytes)} MiB of --model-memory-mb ${this.opts.modelMemoryMb}`;
        throw new BudgetError(`cannot load ${adding.name}: ${why}, and every one of them is busy (holds a request) or pinned (--pin-model)`);
      }
      out.push(victim);
      count--;
      bytes -= victim.memoryBytes;
    }
    return out;
  }

  /** The models idle past --model-idle-unload-s (none pinned, none holding a request). */
  idle(loaded: BudgetModel[]): BudgetModel[] {
    if (this.opts.idleUnloadS === undefined) return [];
    const limit = this.opts.idleUnloadS * 1000;
    const now = this.now();
    return loaded.filter((m) => !this.opts.pinned.includes(m.name) && !busy(m.slab) && now - this.lastUsed(m, now) >= limit);
  }
}

/** The budget cannot make room: a load answered 503. */
export class BudgetError extends Error {}

/** Whether any slot of the slab is taken (queued, running, being filled or read). */
function busy(slab: Slab): boolean {
  return slab.free.size() < slab.layout.slotCount;
}

const mib = (bytes: number) => Math.round(bytes / 2 ** 20);
