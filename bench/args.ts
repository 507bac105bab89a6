/**
 * The one command-line parser of the bench scripts. A script declares its
 * options once, in a table (type, default, help line, bounds), and gets back
 * checked, typed values and a --help text written from that same table, so
 * the help, the defaults and the checks cannot drift apart (bench/suite/options.ts
 * is the largest table). Values:
 *   boolean            present or not
 *   string             as given; `choices` limits it
 *   number, int        a number >= `min` (int: an integer)
 *   numbers, ints      a comma-separated list of those (empty items skipped)
 *   strings            a comma-separated list; `choices` limits each item
 *
 * `quick` is the default when the script's own `--quick` flag is given.
 * A bad value ends the run with exit status 2 and one line naming the flag;
 * --help (-h) prints the help and exits 0.
 */
import { parseArgs } from 'node:util';

interface Common {
  help: string;
  /** The value's placeholder in the help (default: the type's, e.g. N, LIST). */
  value?: string;
}
export type OptionSpec = Common &
  (
    | { type: 'boolean' }
    | { type: 'string'; default?: string; quick?: string; choices?: readonly string[] }
    | { type: 'number' | 'int'; min: number; default?: number; quick?: number }
    | { type: 'numbers' | 'ints'; min: number; default?: readonly number[]; quick?: readonly number[] }
    | { type: 'strings'; default?: readonly string[]; quick?: readonly string[]; choices?: readonly string[] }
  );

type Given<O, V> = O extends { default: unknown } ? V : V | undefined;
type ValueOf<O extends OptionSpec> = O extends { type: 'boolean' }
  ? boolean
  : O extends { type: 'number' | 'int' }
    ? Given<O, number>
    : O extends { type: 'numbers' | 'ints' }
      ? Given<O, number[]>
      : O extends { type: 'strings'; choices: readonly (infer C)[] }
        ? Given<O, C[]>
        : O extends { type: 'strings' }
          ? Given<O, string[]>
          : O extends { type: 'string'; choices: readonly (infer C)[] }
            ? Given<O, C>
            : Given<O, string>;
export type Options<T extends Record<string, OptionSpec>> = { -readonly [K in keyof T]: ValueOf<T[K]> };

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
  return items(v).map((x) => num(name, x, min, integer));
}

const items = (v: string) =>
  v
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x !== '');

function checkChoice(name: string, v: string, choices: readonly string[] | undefined): string {
  if (choices && !choices.includes(v)) fail(`--${name}: expected one of ${choices.join(', ')}, got "${v}"`);
  return v;
}

/** One option's value from its text (undefined: not given, so its default). */
function convert(name: string, o: OptionSpec, text: string): unknown {
  switch (o.type) {
    case 'string':
      return checkChoice(name, text, o.choices);
    case 'number':
    case 'int':
      return num(name, text, o.min, o.type === 'int');
    case 'numbers':
    case 'ints':
      return numList(name, text, o.min, o.type === 'ints');
    case 'strings':
      return items(text).map((x) => checkChoice(name, x, o.choices));
  }
}

const PLACEHOLDER: Record<OptionSpec['type'], string> = { boolean: '', string: 'S', number: 'X', int: 'N', numbers: 'LIST', ints: 'LIST', strings: 'LIST' };

const shown = (v: unknown) => (Array.isArray(v) ? v.join(',') : String(v));

/** The --help text: the usage line, then one aligned line per option with its default (and quick default). */
export function helpText(usage: string, spec: Record<string, OptionSpec>): string {
  const heads = Object.entries(spec).map(([name, o]) => `--${name}${o.type === 'boolean' ? '' : ` ${o.value ?? PLACEHOLDER[o.type]}`}`);
  const width = Math.max(...heads.map((h) => h.length)) + 2;
  const lines = Object.values(spec).map((o, i) => {
    const d = 'default' in o && o.default !== undefined ? `default ${shown(o.default)}` : '';
    const q = 'quick' in o && o.quick !== undefined ? `quick ${shown(o.quick)}` : '';
    const note = [d, q].filter(Boolean).join('; ');
    return `  ${heads[i]!.padEnd(width)}${o.help}${note ? ` (${note})` : ''}`;
  });
  return [`usage: ${usage}`, ...lines, `  ${'--help, -h'.padEnd(width)}this text`].join('\n');
}

/** Parses `argv` (default: this process's arguments) against `spec`; see the header. */
export function parseOptions<const T extends Record<string, OptionSpec>>(usage: string, spec: T, argv = process.argv.slice(2)): Options<T> {
  const options: Record<string, { type: 'string' | 'boolean'; short?: string }> = { help: { type: 'boolean', short: 'h' } };
  for (const [name, o] of Object.entries(spec)) options[name] = { type: o.type === 'boolean' ? 'boolean' : 'string' };
  let values: Record<string, string | boolean | undefined>;
  try {
    values = parseArgs({ args: argv, options, strict: true, allowPositionals: false }).values as typeof values;
  } catch (err) {
    fail(`${(err as Error).message} (--help lists the options)`);
  }
  if (values.help) {
    console.log(helpText(usage, spec));
    process.exit(0);
  }
  const quick = values.quick === true;
  const out: Record<string, unknown> = {};
  for (const [name, o] of Object.entries(spec)) {
    const v = values[name];
    if (o.type === 'boolean') out[name] = v === true;
    else if (typeof v === 'string') out[name] = convert(name, o, v);
    else {
      const d = quick && o.quick !== undefined ? o.quick : o.default;
      out[name] = Array.isArray(d) ? [...d] : d; // a copy: the table's defaults stay as declared
    }
  }
  return out as Options<T>;
}
