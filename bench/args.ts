/**
 * Command-line number checks shared by the bench scripts (quick.ts,
 * scheduling.ts, suite.ts): a bad flag ends the run with exit status 2 and
 * one line saying which flag and why.
 */

export function fail(msg: string): never {
  console.error(msg);
  process.exit(2);
}

/** `v` as a number >= `min` (an integer if asked), or exit 2 naming `--name`. */
export function num(name: string, v: string, min: number, integer = false): number {
  const n = Number(v);
  if (v.trim() === '' || !Number.isFinite(n) || n < min || (integer && !Number.isInteger(n))) {
    fail(`--${name}: expected ${integer ? 'an integer' : 'a number'} >= ${min}, got "${v}"`);
  }
  return n;
}

/** A comma-separated list of numbers >= `min` (empty items skipped). */
export function numList(name: string, v: string, min: number, integer = false): number[] {
  return v
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x !== '')
    .map((x) => num(name, x, min, integer));
}
