/**
 * The models one owner thread serves (a gateway thread, the in-process engine),
 * changed while it serves: what the model repository asks of each owner
 * (src/main/repository/repository.ts). By model id (ModelPlan.index) their
 * plans and slabs, as every per-model array: holes once a model is gone; and
 * the models new requests find, by name and by task.
 *
 *   addModel(plan)   map its slab, read its tokenizer, then new requests find it
 *                    (a reload: in place of the version served so far)
 *   retireModel(id)  new requests no longer find it; those under way finish
 *   dropModel(id)    forget its slab: false while this owner still waits on any of its inputs
 */
import type { ModelPlan } from '../shared/model-plan.js';
import { Slab } from '../shared/slab.js';
import { ModelNotFoundError, OutputUnavailableError, WrongTaskError } from '../shared/errors.js';
import { checkModelName, type ModelOutput, type Task } from '../shared/model-format/model-config.js';
import type { ServedModel } from './served-model.js';
import type { SlabSubmitter } from './submitter.js';
import { loadModelTokenizer } from './tokenizer/tokenizer.js';

export class ModelRegistry {
  readonly plans: ModelPlan[] = [];
  readonly slabs: Slab[] = [];
  /** The models new requests find, in order. */
  private readonly served: ServedModel[] = [];
  private readonly byTask = new Map<Task, readonly ServedModel[]>();

  /** `plans`' slabs mapped; each is found by requests once added with its tokenizer (addModel). */
  constructor(plans: readonly ModelPlan[]) {
    for (const p of plans) {
      this.plans[p.index] = p;
      this.slabs[p.index] = new Slab(p.slab, p.layout);
    }
  }

  list(): ServedModel[] {
    return this.served;
  }

  /** How a model not loaded can be, said in its 404 (the gateway knows the repository's folders). */
  missingHint: ((name: string) => string) | undefined;

  /** Serves `model` from now on, in place of the version of it served so far (a reload), else after the others. */
  addModel(model: ServedModel): void {
    const at = this.served.findIndex((x) => x.plan.spec.name === model.plan.spec.name);
    if (at >= 0) this.served[at] = model;
    else this.served.push(model);
    this.byTask.clear();
  }

  /** New requests no longer find the model of id `id` (requests that already did finish on it). False if it was not served. */
  removeModel(id: number): boolean {
    const at = this.served.findIndex((x) => x.plan.index === id);
    if (at < 0) return false;
    this.served.splice(at, 1);
    this.byTask.clear();
    return true;
  }

  /** The models of `task`, in order (made once per task: asked on every request). */
  modelsOf(task: Task): readonly ServedModel[] {
    let list = this.byTask.get(task);
    if (!list) this.byTask.set(task, (list = this.served.filter((x) => x.plan.spec.task === task)));
    return list;
  }

  /**
   * The named model, or the first of the right task; checks the task matches.
   * Every route of the embed task but /embed_sparse and /embed_all reads
   * pooled rows, so for 'embed' this is resolveOutput('dense'): a ColBERT
   * model (token vectors only) is 424 there.
   */
  resolve(task: Task, name?: string): ServedModel {
    return task === 'embed' ? this.resolveOutput('dense', 'this route', name) : this.ofTask(task, name);
  }

  private ofTask(task: Task, name?: string): ServedModel {
    if (name !== undefined) {
      const m = this.byName(name);
      if (m.plan.spec.task !== task) throw new WrongTaskError(`model "${name}" is a ${m.plan.spec.task} model, not ${task}`);
      return m;
    }
    const m = this.modelsOf(task)[0];
    if (!m) throw new ModelNotFoundError(`(any ${task} model)`, this.names());
    return m;
  }

  /**
   * The named embedding model, which must give `output`, or the first that
   * does: a model without it is refused 424 naming what it gives (TEI's answer
   * to /embed_sparse on a dense model).
   */
  resolveOutput(output: ModelOutput, route: string, name?: string): ServedModel {
    if (name !== undefined) {
      const m = this.ofTask('embed', name);
      if (!m.plan.spec.outputs.includes(output)) {
        throw new OutputUnavailableError(`model "${name}" has no ${output} output for ${route}: it gives ${m.plan.spec.outputs.join(' and ')}`);
      }
      return m;
    }
    const embedders = this.modelsOf('embed');
    if (embedders.length === 0) throw new ModelNotFoundError('(any embed model)', this.names());
    const m = embedders.find((x) => x.plan.spec.outputs.includes(output));
    if (!m) throw new OutputUnavailableError(`no model served gives a ${output} output for ${route} (served: ${this.names().join(', ') || 'none'})`);
    return m;
  }

  /** The named model, or the first loaded one (any task): for routes that only tokenize. */
  anyModel(name?: string): ServedModel {
    if (name !== undefined) return this.byName(name);
    const m = this.served[0];
    if (!m) throw new ModelNotFoundError('(any model)', []);
    return m;
  }

  /**
   * The loaded model named `name` (or, fetched by its Hub id, with that repository id). A name
   * that matches none and no model can have (checkModelName, shared/model-format/model-config.ts:
   * `..`, slashes, percent signs, over 128 characters) is refused as invalid.
   */
  byName(name: string): ServedModel {
    // A model fetched by its Hub id answers to "ORG/NAME" too (what OpenAI's clients send).
    const m = this.served.find((x) => x.plan.spec.name === name || x.plan.spec.hub?.repo === name);
    if (m) return m;
    checkModelName(name);
    throw new ModelNotFoundError(name, this.names(), this.missingHint?.(name));
  }

  names(): string[] {
    return this.served.map((m) => m.plan.spec.name);
  }

  /** The handlers the repository calls by name (RPC methods of a gateway thread). */
  handlers(submitter: SlabSubmitter): Record<'addModel' | 'retireModel' | 'dropModel', (arg: unknown) => unknown> {
    return {
      addModel: async (arg) => {
        const plan = arg as ModelPlan;
        if (this.plans[plan.index]) return; // started after the model was added: it has it
        const tokenizer = await loadModelTokenizer(plan.spec);
        const slab = new Slab(plan.slab, plan.layout);
        this.plans[plan.index] = plan;
        this.slabs[plan.index] = slab;
        submitter.addModel(plan.index, slab, { lengths: plan.batching.buckets, capacities: plan.capacities });
        this.addModel({ plan, tokenizer });
      },
      retireModel: (id) => this.removeModel(id as number),
      dropModel: (id) => {
        if (!submitter.removeModel(id as number)) return false;
        delete this.plans[id as number];
        delete this.slabs[id as number];
        return true;
      },
    };
  }
}
