/**
 * "Did you mean ...?" for a misspelled name: the known name closest to it in
 * edit distance (insertions, deletions, substitutions and swaps of two
 * neighbours, each 1), if it is close enough to be a plausible typo.
 */

/** The known name nearest to `name`, or null when none is within a third of its length (at least 2 edits). */
export function nearestName(name: string, known: Iterable<string>): string | null {
  const lower = name.toLowerCase();
  const bound = Math.max(2, Math.floor(name.length / 3));
  let best: string | null = null;
  let bestDistance = bound + 1;
  for (const k of known) {
    const d = editDistance(lower, k.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [k, d];
  }
  return best;
}

/** Optimal string alignment distance (Damerau-Levenshtein without repeated edits of one substring). */
export function editDistance(a: string, b: string): number {
  // Rows i-2, i-1 and i of the dynamic programme over prefixes of a and b.
  let before = new Array<number>(b.length + 1).fill(0);
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(previous[j]! + 1, row[j - 1]! + 1, previous[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, before[j - 2]! + 1);
      row.push(d);
    }
    [before, previous] = [previous, row];
  }
  return previous[b.length]!;
}
