/**
 * Sentence similarity as text-embeddings-inference's /similarity and Hugging
 * Face's sentence-similarity task define it: the cosine of each sentence's
 * embedding with the source sentence's. Pure.
 */

/** cos(a, b) = a.b / (|a| |b|), in float64; 0 when either vector is zero. */
export function cosineSimilarity(a: Float32Array, b: Float32Array): number {
  if (a.length !== b.length) throw new RangeError(`vectors of ${a.length} and ${b.length} components`);
  let dot = 0;
  let aa = 0;
  let bb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i]! * b[i]!;
    aa += a[i]! * a[i]!;
    bb += b[i]! * b[i]!;
  }
  return aa > 0 && bb > 0 ? dot / Math.sqrt(aa * bb) : 0;
}

/** The cosine of rows[1..] each with rows[0] (the source), as float32 (TEI answers f32). */
export function similaritiesToFirst(rows: readonly Float32Array[]): Float32Array {
  const source = rows[0]!;
  const out = new Float32Array(rows.length - 1);
  for (let i = 1; i < rows.length; i++) out[i - 1] = cosineSimilarity(source, rows[i]!);
  return out;
}
