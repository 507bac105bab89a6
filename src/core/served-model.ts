/** A model as the request pipeline serves it: its plan and its tokenizer. */
import type { ModelPlan } from '../shared/model-plan.js';
import type { TextTokenizer } from './tokenizer/tokenizer.js';

export interface ServedModel {
  plan: ModelPlan;
  tokenizer: TextTokenizer;
}
