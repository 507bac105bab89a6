/**
 * The model repository at runtime, on the main thread: which folders of
 * --models-dir are served, and loading, reloading and unloading them while
 * the others keep serving (Triton's model repository extension, served by
 * src/gateway/kserve/http.ts; docs/model-repository.md).
 *
 * A load plans the folder as a new model id (src/main/repository/model-set.ts), opens and
 * warms it up in the inference thread beside the other models' batches, then
 * hands its slab to every gateway thread: from that moment new requests find
 * it. A reload does the same beside the version served, and the gateways
 * switch to the new one at once; the old one is then retired as an unload
 * retires a model: no gateway finds it any more, its slots all come back (the
 * requests that held them answered), and only then its session is released
 * and its slab forgotten. Operations on one name run one after another.
 */
import { existsSync, readdirSync, realpathSync, statSync } from 'node:fs';
import { basename, dirname, isAbsolute, join, relative, resolve } from 'node:path';
import { loadModelTokenizer } from '../../core/tokenizer/tokenizer.js';
import type { ModelOpened } from '../../gpu-worker/thread.js';
import { BudgetError, type ModelBudget } from './model-budget.js';
import type { ModelSet } from './model-set.js';
import { listModelDirs, isValidModelName, type ServeSettings } from '../../shared/model-format/model-config.js';
import { externalDataFiles } from '../../shared/model-format/hf-folder.js';
import type { ModelPlan } from '../../shared/model-plan.js';
import type { ModelFolder } from '../plan-models.js';
import { hubIdOf, type HubModelId } from '../hub/hub-id.js';
import { SlabserveError, type ErrorType } from '../../shared/errors.js';
import type { RepositoryMetrics } from '../../shared/telemetry/metrics.js';
import type { ModelControlMode } from '../../shared/options.js';
import type { IndexEntry, ModelState, RepositoryAnswer, RepositoryOp, ServedSource } from '../../shared/repository-protocol.js';


/** A repository operation refused or failed (answered 400 with its message, as Triton answers). */
export class RepositoryError extends SlabserveError {
  constructor(message: string) {
    super(message, 'SLABSERVE_REPOSITORY', 'validation');
  }
}

export interface RepositoryOptions {
  mode: ModelControlMode;
  modelsDir: string;
  models: ModelSet;
  /** The inference side (InferenceSupervisor). */
  inference: { addModel(plan: ModelPlan): Promise<ModelOpened>; removeModel(id: number): Promise<void> };
  /** Every gateway thread: `method` called on each, rejecting with the first failure (GatewaySupervisor.callEvery). */
  gateways: { callEvery<T>(method: string, arg: unknown, timeoutMs: number): Promise<T[]> };
  /** Plans a folder as model id `id` with the server's settings (src/main/plan-models.ts planModel). */
  plan: (folder: ModelFolder, id: number, serve?: ServeSettings) => Promise<ModelPlan>;
  /** Fetches a model named by its Hub id (ORG/NAME[@REVISION]) into the cache (src/main/plan-models.ts locateHubModel); absent: loads take folders only. */
  fetchHub?: (id: HubModelId) => Promise<ModelFolder>;
  /** The model set changed: tell the gateways (the /info document). */
  onChange: () => Promise<void>;
  log: (line: string) => void;
  /** The longest an unload waits for the requests its model holds (their own deadlines end them sooner). */
  drainTimeoutMs: number;
  /** Counts loads and unloads (absent: not counted). */
  metrics?: RepositoryMetrics;
  /** A load may name a folder by its path, anywhere (the in-process engine, whose caller is the operator); never over HTTP. */
  paths?: boolean;
  /** How many models, how much memory, how long idle (src/main/repository/model-budget.ts); absent: no limits. */
  budget?: ModelBudget;
}

/** Before a model is measured: its graph file, the external data beside it (model.onnx_data, model.onnx.data, ...), and its slab. */
function estimatedBytes(plan: ModelPlan): number {
  let graph = 0;
  try {
    const file = basename(plan.spec.onnxPath);
    const dir = dirname(plan.spec.onnxPath);
    for (const f of [file, ...externalDataFiles(readdirSync(dir), file)]) graph += statSync(join(dir, f)).size;
  } catch {
    // measured after its load, if it loads
  }
  return graph + plan.slab.byteLength;
}

/** How long a gateway may take to add a model (its tokenizer read) or drop one. */
const GATEWAY_RPC_MS = 60_000;
/** A failed lazy load is answered again, not tried again, for this long: requests for a broken folder do not each reread it. */
export const LAZY_RETRY_MS = 10_000;
/** How often an unload looks whether its model's slots have all come back. */
const SLOTS_POLL_MS = 5;

interface Entry {
  state: ModelState;
  reason: string;
  /** Loads of this name that succeeded. */
  generation: number;
  /** Where it is: under modelsDir, or the folder it was started from (--model PATH), or a Hub snapshot. */
  dir?: string;
  /** The --model value that finds it again (ModelRepository.served). */
  given?: string;
  /** Its footprint as measured at its load (null: loaded at start, not measured alone). */
  memoryBytes: number | null;
}

export class ModelRepository {
  private readonly opts: RepositoryOptions;
  private readonly entries = new Map<string, Entry>();
  /** The tail of each name's operations (one after another). */
  private readonly tails = new Map<string, Promise<unknown>>();
  /** The lazy load of each name under way (ensure()). */
  private readonly ensuring = new Map<string, Promise<void>>();
  /** The tail of the loads that take room in the budget (withBudget). */
  private budgetTail: Promise<void> = Promise.resolve();
  /** The last failed lazy load of each name: answered again for LAZY_RETRY_MS rather than tried again. */
  private readonly lazyFailures = new Map<string, { error: unknown; at: number }>();
  private nextId: number;

  constructor(opts: RepositoryOptions) {
    this.opts = opts;
    this.nextId = opts.models.nextId();
    for (const p of opts.models.plans()) this.entries.set(p.spec.name, { state: 'READY', reason: '', generation: 1, dir: p.spec.dir, given: this.givenOf(p.spec), memoryBytes: null });
  }

  get mode(): ModelControlMode {
    return this.opts.mode;
  }

  /** One operation from a gateway, answered as data. */
  async handle(op: RepositoryOp): Promise<RepositoryAnswer> {
    try {
      if (op.op === 'index') return { ok: true, index: this.index(op.ready ?? false) };
      if (op.op === 'served') return { ok: true, served: this.served() };
      if (op.op === 'load') await this.load(op.name, op.config);
      else if (op.op === 'ensure') await this.ensure(op.name);
      else await this.unload(op.name);
      return { ok: true };
    } catch (err) {
      const e = err instanceof SlabserveError ? err : new RepositoryError((err as Error).message);
      return { ok: false, message: e.message, code: e.code, type: e.type };
    }
  }

  /** Every model folder of the repository and every model served, sorted by name (`ready`: only those READY). */
  index(ready = false): IndexEntry[] {
    const out: IndexEntry[] = [];
    for (const name of this.known()) {
      const e = this.entries.get(name);
      const row: IndexEntry = e
        ? { name, ...(e.generation > 0 ? { version: String(e.generation) } : {}), state: e.state, reason: e.reason }
        : { name, state: 'UNAVAILABLE', reason: 'not loaded' };
      if (!ready || row.state === 'READY') out.push(row);
    }
    return out;
  }

  /** The models served now and what each was measured to take (slabserve_model_memory_bytes). */
  loaded(): { name: string; memoryBytes: number | null }[] {
    return [...this.entries].flatMap(([name, e]) => (e.state === 'READY' || e.state === 'UNLOADING' ? [{ name, memoryBytes: e.memoryBytes }] : []));
  }

  /** The models served, each with the --model value that finds it again. */
  served(): ServedSource[] {
    return [...this.entries].flatMap(([name, e]) => (e.state === 'READY' && e.given ? [{ name, given: e.given }] : []));
  }

  /** What --model finds `m` by: its name in the models directory, its Hub id at the commit served, else its folder's path. */
  private givenOf(m: { name: string; dir: string; hub?: { repo: string; commit: string } | undefined }): string {
    if (m.hub) return `${m.hub.repo}@${m.hub.commit}`;
    return m.dir === join(this.opts.modelsDir, m.name) ? m.name : m.dir;
  }

  /** Every name the repository knows: its folders and the models served. */
  known(): string[] {
    return [...new Set([...listModelDirs(this.opts.modelsDir), ...this.entries.keys()])].sort();
  }

  /**
   * Loads `name` (or reloads it, when served) and resolves once it takes requests. With `paths`,
   * `name` may be a folder's path; with `fetchHub`, a Hub id (an explicit load only, never a lazy one).
   */
  async load(name: string, serve?: ServeSettings, hub = true): Promise<void> {
    this.checkControl('load');
    const id = hub && this.opts.fetchHub ? hubIdOf(name, this.opts.paths ?? false) : null;
    const folder = id ? await this.opts.fetchHub!(id) : this.folderOf(name);
    this.lazyFailures.delete(folder.name); // an explicit load tries again at once
    return this.serialize(folder.name, () => this.doLoad(folder, serve));
  }

  /**
   * Lazy loading: resolves once `name` is served, loading it unless it is; every call made while
   * one load of it runs shares that load and its outcome (one load, however many first requests).
   */
  ensure(name: string): Promise<void> {
    const serving = this.opts.models.byName(name);
    if (serving && this.entries.get(name)?.state === 'READY') return Promise.resolve();
    const failed = this.lazyFailures.get(name);
    if (failed && Date.now() - failed.at < LAZY_RETRY_MS) return Promise.reject(failed.error);
    let shared = this.ensuring.get(name);
    if (!shared) {
      shared = this.load(name, undefined, false)
        .catch((error: unknown) => {
          this.lazyFailures.set(name, { error, at: Date.now() });
          throw error;
        })
        .finally(() => this.ensuring.delete(name));
      this.ensuring.set(name, shared);
    }
    return shared;
  }

  /** Unloads `name`: refused for new requests at once, freed once the ones it holds have finished. */
  unload(name: string): Promise<void> {
    this.checkControl('unload');
    return this.serialize(name, () => this.doUnload(name));
  }

  private checkControl(op: string): void {
    if (this.opts.mode !== 'explicit') {
      throw new RepositoryError(`cannot ${op} models: the model set is fixed (--model-control-mode none); start with --model-control-mode explicit`);
    }
  }

  private serialize(name: string, op: () => Promise<void>): Promise<void> {
    const run = (this.tails.get(name) ?? Promise.resolve()).then(op, op);
    const tail = run.catch(() => {});
    this.tails.set(name, tail);
    void tail.then(() => {
      if (this.tails.get(name) === tail) this.tails.delete(name);
    });
    return run;
  }

  private async doLoad(folder: ModelFolder, serve?: ServeSettings): Promise<void> {
    const name = folder.name;
    const entry: Entry = this.entries.get(name) ?? { state: 'UNAVAILABLE', reason: '', generation: 0, memoryBytes: null };
    this.entries.set(name, entry);
    const old = this.opts.models.byName(name);
    const wasState = entry.state;
    entry.state = 'LOADING';
    const started = performance.now();
    let plan: ModelPlan | undefined;
    try {
      plan = await this.opts.plan(folder, this.nextId++, serve);
      await loadModelTokenizer(plan.spec); // a tokenizer.json that does not parse fails here, before any thread sees it
      const p = plan;
      // A new model counts against the budget: loads of new models take their room one at a time.
      const opened = old || !this.opts.budget?.active ? await this.serve(p) : await this.withBudget(() => this.makeRoom(name, estimatedBytes(p)).then(() => this.serve(p)));
      // Measured (host and, on CUDA, device memory); an RSS delta lost in other threads' churn (0 or less) falls back to the estimate.
      const measured = opened.rssBytes + Math.max(0, opened.deviceBytes ?? 0);
      const memoryBytes = opened.rssBytes > 0 ? measured + plan.slab.byteLength : estimatedBytes(plan);
      Object.assign(entry, { state: 'READY', reason: '', generation: entry.generation + 1, dir: folder.dir, given: this.givenOf(folder), memoryBytes });
      this.opts.metrics?.loads.inc({ model: name, outcome: 'ok' });
      this.opts.budget?.touch(name, this.opts.models.slab(plan.index)!);
      this.opts.metrics?.loadSeconds.observe({ model: name }, (performance.now() - started) / 1000);
      this.opts.log(`slabserve: model ${name} ${old ? 'reloaded' : 'loaded'} (id ${plan.index}, open ${Math.round(opened.openMs)} ms, warm-up ${Math.round(opened.warmUpMs)} ms)`);
    } catch (err) {
      const reason = (err as Error).message;
      Object.assign(entry, { state: old ? wasState : 'UNAVAILABLE', reason });
      this.opts.metrics?.loads.inc({ model: name, outcome: 'failed' });
      if (plan && this.opts.models.slab(plan.index)) await this.retire(plan); // half-served: take it back
      else if (plan) await this.opts.inference.removeModel(plan.index).catch(() => {});
      this.opts.log(`slabserve: model ${name}: load failed: ${reason.split('\n')[0]}`);
      throw err instanceof SlabserveError && err.type === 'unavailable' ? err : new RepositoryError(`failed to load '${name}': ${reason}`);
    }
    await this.opts.onChange();
    if (old) await this.retire(old, 'reload'); // the gateways already send its requests to the new version
  }

  private async doUnload(name: string): Promise<void> {
    const plan = this.opts.models.byName(name);
    const entry = this.entries.get(name);
    if (!plan || !entry) {
      if (!this.knows(name)) throw new RepositoryError(`no model '${name}' in the repository`);
      return; // not loaded: nothing to do (Triton answers 200 too)
    }
    entry.state = 'UNLOADING';
    this.opts.models.retire(plan.index);
    await this.opts.gateways.callEvery('retireModel', plan.index, GATEWAY_RPC_MS);
    await this.opts.onChange();
    await this.retire(plan, 'request');
    Object.assign(entry, { state: 'UNAVAILABLE', reason: 'unloaded', memoryBytes: null });
    this.opts.log(`slabserve: model ${name} unloaded (id ${plan.index})`);
  }

  /**
   * Frees a model no gateway finds any more (retired, or replaced by a reload): once its slots
   * have all come back, its session is released and its slab forgotten everywhere.
   */
  private async retire(plan: ModelPlan, reason?: 'request' | 'reload' | 'budget' | 'idle'): Promise<void> {
    this.opts.models.retire(plan.index);
    await this.opts.gateways.callEvery('retireModel', plan.index, GATEWAY_RPC_MS); // no new request finds it
    const slab = this.opts.models.slab(plan.index);
    const deadline = Date.now() + this.opts.drainTimeoutMs;
    let told = false;
    while (slab && slab.free.size() < slab.layout.slotCount) {
      if (!told && Date.now() > deadline) {
        told = true;
        this.opts.log(`slabserve: model ${plan.spec.name} (id ${plan.index}): ${slab.layout.slotCount - slab.free.size()} slots still held after ${this.opts.drainTimeoutMs} ms; still waiting`);
      }
      await new Promise((r) => setTimeout(r, SLOTS_POLL_MS));
    }
    await this.opts.inference.removeModel(plan.index);
    // A gateway still settling the last completions says false: ask again.
    for (;;) {
      const dropped = await this.opts.gateways.callEvery<boolean>('dropModel', plan.index, GATEWAY_RPC_MS);
      if (dropped.every(Boolean)) break;
      await new Promise((r) => setTimeout(r, SLOTS_POLL_MS));
    }
    this.opts.models.remove(plan.index);
    if (reason) this.opts.metrics?.unloads.inc({ model: plan.spec.name, reason });
  }

  /** Opens `plan` in the inference thread, then hands it to every gateway: from then on requests find it. */
  private async serve(plan: ModelPlan): Promise<ModelOpened> {
    const opened = await this.opts.inference.addModel(plan);
    this.opts.models.add(plan);
    await this.opts.gateways.callEvery('addModel', plan, GATEWAY_RPC_MS);
    return opened;
  }

  /** Runs `f` alone among the loads that take room in the budget (two loads never count the same room). */
  private withBudget<T>(f: () => Promise<T>): Promise<T> {
    const run = this.budgetTail.then(f, f);
    this.budgetTail = run.then(
      () => {},
      () => {},
    );
    return run;
  }

  /** Unloads what the budget says must go for `name` to fit (least recently used first); a 503 when nothing can. */
  private async makeRoom(name: string, bytes: number): Promise<void> {
    const budget = this.opts.budget;
    if (!budget?.active) return;
    const loaded = this.opts.models.serving().flatMap((p) => {
      const e = this.entries.get(p.spec.name);
      if (p.spec.name === name || e?.state !== 'READY') return [];
      return [{ name: p.spec.name, slab: this.opts.models.slab(p.index)!, memoryBytes: e.memoryBytes ?? estimatedBytes(p) }];
    });
    let victims;
    try {
      victims = budget.makeRoom(loaded, { name, memoryBytes: bytes });
    } catch (err) {
      if (err instanceof BudgetError) throw new SlabserveError(err.message, 'SLABSERVE_MODEL_BUDGET', 'unavailable');
      throw err;
    }
    for (const v of victims) await this.evict(v.name, 'budget');
  }

  /** Unloads a READY model for the budget or for idling, outside its name's queue (a load of another waits for it). */
  private async evict(name: string, reason: 'budget' | 'idle'): Promise<void> {
    const entry = this.entries.get(name);
    const plan = this.opts.models.byName(name);
    if (!entry || !plan || entry.state !== 'READY') return;
    entry.state = 'UNLOADING';
    this.opts.models.retire(plan.index);
    await this.opts.gateways.callEvery('retireModel', plan.index, GATEWAY_RPC_MS);
    await this.opts.onChange();
    await this.retire(plan, reason);
    Object.assign(entry, { state: 'UNAVAILABLE', reason: `unloaded: ${reason === 'idle' ? `idle for --model-idle-unload-s ${this.opts.budget!.opts.idleUnloadS}` : 'to make room for another (the budget)'}`, memoryBytes: null });
    this.opts.budget?.forget(name);
    this.opts.log(`slabserve: model ${name} unloaded (${reason})`);
  }

  /** Unloads the models idle past --model-idle-unload-s (the server calls it every second). */
  async unloadIdle(): Promise<void> {
    const budget = this.opts.budget;
    if (budget?.opts.idleUnloadS === undefined) return;
    const loaded = this.opts.models.serving().flatMap((p) => {
      const name = p.spec.name;
      if (this.entries.get(name)?.state !== 'READY' || this.tails.has(name)) return []; // an operation on it is under way
      return [{ name, slab: this.opts.models.slab(p.index)!, memoryBytes: 0 }];
    });
    for (const m of budget.idle(loaded)) await this.evict(m.name, 'idle');
  }

  private knows(name: string): boolean {
    return this.entries.has(name) || listModelDirs(this.opts.modelsDir).includes(name);
  }

  /** The folder of `name`: under modelsDir (never outside it, a symlink included), or the one it was started from. */
  private folderOf(name: string): { name: string; dir: string } {
    if (this.opts.paths && (name.includes('/') || name.includes('\\'))) {
      const dir = resolve(name);
      if (!existsSync(join(dir, 'config.json'))) throw new RepositoryError(`model folder ${dir} has no config.json`);
      return { name: basename(dir), dir };
    }
    if (!isValidModelName(name)) throw new RepositoryError(`invalid model name '${name}' (letters, digits, ".", "_", "-")`);
    const started = this.entries.get(name)?.dir;
    const inRepo = join(this.opts.modelsDir, name);
    if (started && started !== inRepo) return { name, dir: started };
    if (!existsSync(join(inRepo, 'config.json'))) {
      throw new RepositoryError(`no model folder '${name}' in the models directory ${this.opts.modelsDir} (a folder with a config.json)`);
    }
    const folder = { name, dir: inRepo };
    const real = realpathSync(folder.dir);
    const rel = relative(realpathSync(this.opts.modelsDir), real);
    if (rel.startsWith('..') || isAbsolute(rel)) throw new RepositoryError(`model folder ${folder.dir} leads outside the models directory (${real}): refused`);
    return folder;
  }
}
