/**
 * The models one owner thread submits to (a gateway thread, the in-process
 * engine), changed while it serves: what the model repository asks of each
 * owner (src/main/repository/repository.ts). By model id (ModelPlan.index), as every
 * per-model array: holes once a model is gone.
 *
 *   add(plan)     map its slab, read its tokenizer, then new requests find it
 *                 (a reload: in place of the version served so far)
 *   retire(id)    new requests no longer find it; those under way finish
 *   drop(id)      forget its slab: false while this owner still waits on any of its inputs
 */
import type { ModelPlan } from '../shared/model-plan.js';
import { Slab } from '../shared/slab.js';
import type { SlabSubmitter } from './submitter.js';
import type { Infer } from './infer.js';
import { loadModelTokenizer } from './tokenizer/tokenizer.js';

export class OwnerModels {
  readonly plans: ModelPlan[] = [];
  readonly slabs: Slab[] = [];

  constructor(plans: readonly ModelPlan[]) {
    for (const p of plans) {
      this.plans[p.index] = p;
      this.slabs[p.index] = new Slab(p.slab, p.layout);
    }
  }

  /** The handlers the repository calls by name (RPC methods of a gateway thread). */
  handlers(submitter: SlabSubmitter, infer: Infer): Record<'addModel' | 'retireModel' | 'dropModel', (arg: unknown) => unknown> {
    return {
      addModel: async (arg) => {
        const plan = arg as ModelPlan;
        if (this.plans[plan.index]) return; // started after the model was added: it has it
        const tokenizer = await loadModelTokenizer(plan.spec);
        const slab = new Slab(plan.slab, plan.layout);
        this.plans[plan.index] = plan;
        this.slabs[plan.index] = slab;
        submitter.addModel(plan.index, slab, { lengths: plan.batching.buckets, capacities: plan.capacities });
        infer.addModel({ plan, tokenizer });
      },
      retireModel: (id) => infer.removeModel(id as number),
      dropModel: (id) => {
        if (!submitter.removeModel(id as number)) return false;
        delete this.plans[id as number];
        delete this.slabs[id as number];
        return true;
      },
    };
  }
}
