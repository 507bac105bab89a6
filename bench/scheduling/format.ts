/** A share as a percentage for the tables ('-' when it is not a number, e.g. 0 / 0); bench/table.ts has `fmt` for the rest. */
export const pct = (x: number, digits = 1) => (Number.isFinite(x) ? `${(100 * x).toFixed(digits)}%` : '-');
