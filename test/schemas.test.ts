// The hot request bodies are checked by hand (schemas.ts quickEmbedRequest,
// quickPredictRequest) and fall back to the zod schemas for anything else.
// The two must agree: on fuzzed bodies, whatever the quick check accepts the
// schema accepts with the same fields, and whatever the schema rejects the
// quick check leaves to it (so the error, its type and message are the
// schema's). The seed is printed; SLABSERVE_FUZZ_SEED=S replays it.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { EmbedRequest, parseBody, PredictRequest, quickEmbedRequest, quickPredictRequest } from '../dist/src/gateway/schemas.js';

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
const body = fc.oneof(
  {
    weight: 12,
    arbitrary: fc.record(
      {
        inputs,
        normalize: maybe(fc.boolean()),
        truncate: maybe(fc.boolean()),
        raw_scores: maybe(fc.boolean()),
        embedding_type: maybe(fc.constantFrom('float', 'int8', 'uint8', 'binary', 'ubinary', 'Int8', 'bits')),
        model: maybe(fc.string({ maxLength: 10 })),
        timeout: maybe(edgyNumber),
        priority: maybe(fc.string({ minLength: 60, maxLength: 68 })),
        extra: maybe(fc.anything()),
      },
      { requiredKeys: [] },
    ),
  },
  { weight: 1, arbitrary: fc.anything() },
);

const schemas = [
  { name: 'embed', schema: EmbedRequest, quick: quickEmbedRequest },
  { name: 'predict', schema: PredictRequest, quick: quickPredictRequest },
];

describe('the quick body checks agree with the schemas', () => {
  console.log(`schemas: seed ${seed}`);
  for (const { name, schema, quick } of schemas) {
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
