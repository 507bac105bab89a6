/**
 * Request bodies, validated with zod. A failed parse becomes a
 * ValidationError whose message names the field and the problem.
 */
import { z } from 'zod';
import { ValidationError } from '../shared/errors.js';

const inputs = z.union([z.string(), z.array(z.string()).min(1, 'must not be an empty list')], {
  error: 'must be a string or a list of strings',
});

export const EmbedRequest = z.object({
  inputs,
  normalize: z.boolean().optional(),
  truncate: z.boolean().optional(),
  model: z.string().optional(),
});
export type EmbedRequest = z.infer<typeof EmbedRequest>;

export const PredictRequest = z.object({
  inputs,
  raw_scores: z.boolean().optional(),
  truncate: z.boolean().optional(),
  model: z.string().optional(),
});
export type PredictRequest = z.infer<typeof PredictRequest>;

/** Parses `body` with `schema` or throws a ValidationError listing every problem. */
export function parseBody<T>(schema: z.ZodType<T>, body: unknown): T {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    throw new ValidationError('the body must be an object, e.g. {"inputs": "some text"}');
  }
  const r = schema.safeParse(body);
  if (r.success) return r.data;
  const problems = r.error.issues.map((i) => `${i.path.length ? i.path.join('.') : 'body'}: ${i.message}`);
  throw new ValidationError(`invalid request: ${problems.join('; ')}`);
}
