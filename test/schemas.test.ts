// The hot request bodies are checked by hand (schemas.ts quickEmbedRequest,
// quickPredictRequest) and fall back to the zod schemas for anything else.
// The two must agree: on fuzzed bodies, whatever the quick check accepts the
// schema accepts with the same fields, and whatever the schema rejects the
// quick check leaves to it (so the error, its type and message are the
// schema's). The seed is printed; SLABSERVE_FUZZ_SEED=S replays it.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { EmbedRequest, parseBody, PredictRequest, quickEmbedRequest, quickPredictRequest, SimilarityRequest } from '../dist/src/gateway/schemas.js';
import { UnknownFieldError } from '../dist/src/shared/errors.js';
import { editDistance, nearestName } from '../dist/src/gateway/nearest-name.js';

const seed = Number(process.env.SLABSERVE_FUZZ_SEED ?? Math.floor(Math.random() * 2 ** 31));

/** Numbers where the checks have edges: ids (negative, fractional, past 2^53), timeouts (0, the hour, past it), non-finite. */
const edgyNumber = fc.oneof(
  fc.integer({ min: 0, max: 30_000 }),
  fc.constantFrom(0, -0, -1, 1.5, 2 ** 53 - 1, 2 ** 53, 2 ** 60, 3_600_000, 3_600_000.5, 1e-9, Number.NaN, Infinity, -Infinity),
  fc.double(),
);
const idList = fc.array(fc.oneof({ weight: 8, arbitrary: fc.integer({ min: 0, max: 30_000 }) }, { weight: 1, arbitrary: edgyNumber }), { minLength: 0, maxLength: 6 });
const oddValue = fc.oneof(fc.constant(null), fc.constant(undefined), fc.boolean(), edgyNumber, fc.string({ maxLength: 4 }), fc.constant([]), fc.constant({}));
const inputs = fc.oneof(
  { weight: 4, arbitrary: fc.string({ maxLength: 12 }) },
  { weight: 3, arbitrary: idList },
  { weight: 4, arbitrary: fc.array(fc.oneof(fc.string({ maxLength: 8 }), idList), { minLength: 0, maxLength: 4 }) },
  { weight: 1, arbitrary: fc.array(oddValue, { maxLength: 3 }) },
  { weight: 1, arbitrary: oddValue },
);
const maybe = <T>(arb: fc.Arbitrary<T>) => fc.option(fc.oneof({ weight: 5, arbitrary: arb as fc.Arbitrary<unknown> }, { weight: 1, arbitrary: oddValue }), { nil: undefined, freq: 2 });
/** The fields both bodies take, then each one's own; `extra` (unknown to both) and the other body's fields turn up now and then. */
const common = {
  inputs,
  truncate: maybe(fc.boolean()),
  model: maybe(fc.string({ maxLength: 10 })),
  timeout: maybe(edgyNumber),
  priority: maybe(fc.string({ minLength: 60, maxLength: 68 })),
};
const embedFields = { normalize: maybe(fc.boolean()), embedding_type: maybe(fc.constantFrom('float', 'int8', 'uint8', 'binary', 'ubinary', 'Int8', 'bits')) };
const predictFields = { raw_scores: maybe(fc.boolean()) };
/** A body of `own` fields; one in six also holds some of `others` (the other body's fields) or an unknown `extra`, which the schema refuses. */
const bodyOf = (own: Record<string, fc.Arbitrary<unknown>>, others: Record<string, fc.Arbitrary<unknown>>) => {
  const known = fc.record({ ...common, ...own }, { requiredKeys: [] });
  const foreign = fc.record({ ...others, extra: fc.anything() }, { requiredKeys: [] });
  return fc.oneof(
    { weight: 10, arbitrary: known },
    { weight: 2, arbitrary: fc.tuple(known, foreign).map(([a, b]) => ({ ...a, ...b })) },
    { weight: 1, arbitrary: fc.anything() },
  );
};

const schemas = [
  { name: 'embed', schema: EmbedRequest, quick: quickEmbedRequest, body: bodyOf(embedFields, predictFields) },
  { name: 'predict', schema: PredictRequest, quick: quickPredictRequest, body: bodyOf(predictFields, embedFields) },
];

describe('the quick body checks agree with the schemas', () => {
  console.log(`schemas: seed ${seed}`);
  for (const { name, schema, quick, body } of schemas) {
    it(`${name}: accepted only where the schema accepts, with the same fields; rejected bodies go to the schema`, () => {
      let quickAccepted = 0;
      let schemaRejected = 0;
      fc.assert(
        fc.property(body, (b) => {
          const q = quick(b);
          const isObject = typeof b === 'object' && b !== null && !Array.isArray(b);
          const z = isObject ? schema.safeParse(b) : { success: false as const };
          if (!z.success) {
            schemaRejected++;
            expect(q).toBeNull();
            expect(() => parseBody(schema, b)).toThrow(); // the schema's error, as before
          }
          if (q !== null) {
            quickAccepted++;
            expect(z.success).toBe(true);
            expect(q).toEqual((z as { data: unknown }).data); // a key the body holds as undefined is absent here: the same to every reader
          }
        }),
        { seed, numRuns: 3000 },
      );
      // Both paths were exercised: a check that never accepts (or never sees a bad body) proves nothing.
      expect(quickAccepted).toBeGreaterThan(300);
      expect(schemaRejected).toBeGreaterThan(300);
    });
  }

  it('the common bodies take the quick path', () => {
    for (const b of [
      { inputs: 'where is my parcel?' },
      { inputs: ['a', 'b'], normalize: false, truncate: true, model: 'tiny-embed' },
      { inputs: [101, 2054, 102] },
      { inputs: [[101, 102], 'text'], timeout: 250, priority: 'bulk' },
      { inputs: ['a', 'b'], embedding_type: 'ubinary' },
    ]) {
      expect(quickEmbedRequest(b), JSON.stringify(b)).toStrictEqual(EmbedRequest.parse(b));
    }
    expect(quickPredictRequest({ inputs: 'hi', raw_scores: true })).toStrictEqual({ inputs: 'hi', raw_scores: true });
  });
});

describe('unknown fields', () => {
  it('are refused, naming the field and the nearest known one', () => {
    const cases: [typeof EmbedRequest | typeof PredictRequest | typeof SimilarityRequest, unknown, string, string | null][] = [
      [EmbedRequest, { inputs: 'hi', normalise: true }, 'normalise', 'normalize'],
      [EmbedRequest, { inputs: 'hi', trucate: true }, 'trucate', 'truncate'],
      [EmbedRequest, { inputs: 'hi', Model: 'tiny-embed' }, 'Model', 'model'],
      [PredictRequest, { inputs: 'hi', raw_score: true }, 'raw_score', 'raw_scores'],
      [PredictRequest, { inputs: 'hi', normalize: true }, 'normalize', null],
      [SimilarityRequest, { inputs: { source_sentence: 'a', sentences: ['b'] }, parameters: { truncat: true } }, 'parameters.truncat', 'truncate'],
      [SimilarityRequest, { inputs: { source_sentence: 'a', sentences: ['b'], sentence: 'c' } }, 'inputs.sentence', 'sentences'],
    ];
    for (const [schema, body, field, near] of cases) {
      let err: unknown;
      try {
        parseBody(schema as typeof EmbedRequest, body);
      } catch (e) {
        err = e;
      }
      expect(err, JSON.stringify(body)).toBeInstanceOf(UnknownFieldError);
      const u = err as UnknownFieldError;
      expect(u.field).toBe(field);
      expect(u.suggestion).toBe(near);
      expect(u.code).toBe('SLABSERVE_INVALID_INPUT');
      expect(u.message).toContain(`"${field}"`);
      // No near name: the message lists the fields the body takes instead.
      expect(u.message).toContain(near !== null ? `did you mean "${near}"?` : 'the fields are');
    }
  });

  it('the quick path leaves a body with an unknown field to the schema', () => {
    expect(quickEmbedRequest({ inputs: 'hi', normalise: true })).toBeNull();
    expect(quickPredictRequest({ inputs: 'hi', normalize: true })).toBeNull();
    expect(() => parseBody(EmbedRequest, { inputs: 'hi', normalise: true })).toThrow(/did you mean "normalize"/);
  });
});

describe('nearestName', () => {
  it('finds a typo within a third of the name (at least 2 edits), swaps counting once', () => {
    const known = ['inputs', 'normalize', 'truncate', 'truncation_direction', 'model', 'raw_scores'];
    expect(nearestName('normalise', known)).toBe('normalize');
    expect(nearestName('nromalize', known)).toBe('normalize'); // one swap
    expect(nearestName('input', known)).toBe('inputs');
    expect(nearestName('MODEL', known)).toBe('model');
    expect(nearestName('temperature', known)).toBeNull();
    expect(nearestName('xyz', known)).toBeNull();
    expect(editDistance('kitten', 'sitting')).toBe(3);
    expect(editDistance('ab', 'ba')).toBe(1);
    expect(editDistance('', 'abc')).toBe(3);
  });
});
