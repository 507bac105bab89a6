/**
 * The aligned Markdown tables the bench scripts print to the terminal (the
 * report files, bench/report.ts, write their own: escaped cells, no padding).
 */

/** `v` with `digits` decimals; '-' for a missing or non-finite value. */
export function fmt(v: number | null | undefined, digits: number): string {
  if (v === null || v === undefined || !Number.isFinite(v)) return '-';
  return v.toFixed(digits);
}

/** A Markdown table padded to line up in a terminal: columns before `rightFrom` left-aligned, the rest right-aligned. */
export function alignedTable(headers: string[], rows: string[][], rightFrom = 1): string {
  const widths = headers.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => '| ' + cells.map((c, i) => (i < rightFrom ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join(' | ') + ' |';
  const sep = '|' + widths.map((w, i) => (i < rightFrom ? '-'.repeat(w + 2) : '-'.repeat(w + 1) + ':')).join('|') + '|';
  return [line(headers), sep, ...rows.map(line)].join('\n');
}

/** A share as a percentage ('-' when it is not a number, e.g. 0 / 0). */
export const pct = (x: number, digits = 1) => (Number.isFinite(x) ? `${(100 * x).toFixed(digits)}%` : '-');
