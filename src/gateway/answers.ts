/**
 * Answer bodies of the hot routes.
 */

/** Embedding rows as JSON: `[[x, ...], ...]`. */
export function embeddingsJson(rows: readonly Float32Array[]): string {
  return JSON.stringify(rows.map((r) => Array.from(r)));
}
