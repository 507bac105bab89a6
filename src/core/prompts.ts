/**
 * Prompts: a text put before each text input, as sentence-transformers'
 * encode(prompt_name=...) / encode(prompt=...) does (the prompt and the text
 * are one string to the tokenizer, so the prompt counts towards the max input
 * length). A request names one of the model's prompts (`prompt_name`, a key
 * of config_sentence_transformers.json's prompts) or gives one (`prompt`);
 * without either, the model's default prompt applies (--default-prompt-name,
 * --default-prompt, default_prompt_name). Token-id inputs are taken as sent.
 */
import { ValidationError } from '../shared/errors.js';
import type { Input } from './inputs.js';
import type { ServedModel } from './served-model.js';

export interface PromptFields {
  prompt_name?: string | undefined;
  prompt?: string | undefined;
}

/** The prompt a request's texts get ('' for none); a 422 for a name the model lacks. */
export function requestPrompt(model: ServedModel, body: PromptFields): string {
  const spec = model.plan.spec;
  if (body.prompt_name !== undefined && body.prompt !== undefined) throw new ValidationError('give prompt_name or prompt, not both');
  if (body.prompt !== undefined) return body.prompt;
  if (body.prompt_name === undefined) return spec.defaultPrompt?.text ?? '';
  const named = spec.prompts[body.prompt_name];
  if (named !== undefined) return named;
  const known = Object.keys(spec.prompts);
  throw new ValidationError(`model ${spec.name} has no prompt "${body.prompt_name}" (${known.length ? `its prompts: ${known.join(', ')}` : 'it has no prompts'})`);
}

/**
 * The leading tokens of a prompted text that a model with include_prompt
 * false leaves out of its pooling, counted as sentence-transformers counts
 * them: the prompt tokenized alone, less its closing special token ([CLS] and
 * the prompt's own tokens, for BERT).
 */
export function promptTokens(model: ServedModel, prompt: string): number {
  return model.tokenizer.encode(prompt, { maxLength: model.plan.maxLength, truncate: true }).ids.length - 1;
}

/** The inputs with `prompt` before each text; an explicit prompt with token-id inputs is a 422. */
export function withPrompt(inputs: readonly Input[], prompt: string, explicit: boolean): readonly Input[] {
  if (prompt === '') return inputs;
  if (explicit && inputs.some((x) => typeof x !== 'string')) throw new ValidationError('a prompt applies to texts: token ids are taken as they are sent');
  return inputs.map((x) => (typeof x === 'string' ? prompt + x : x));
}

/**
 * The call with the request's prompt (or the model's default one) before each
 * text input, and, for a model that pools without it, how many of its tokens to leave out.
 */
export function prompted<C extends { model: ServedModel; inputs: { kind: 'inputs'; inputs: readonly Input[]; truncate: boolean } }>(call: C, body: PromptFields): C {
  const prompt = requestPrompt(call.model, body);
  if (prompt === '') return call;
  const explicit = body.prompt_name !== undefined || body.prompt !== undefined;
  const inputs = withPrompt(call.inputs.inputs, prompt, explicit);
  const poolFrom = call.model.plan.spec.includePrompt ? undefined : promptTokens(call.model, prompt);
  return { ...call, inputs: { ...call.inputs, inputs, poolFrom } };
}
