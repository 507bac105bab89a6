/**
 * The bench scripts' one command-line parser (bench/args.ts): typed values
 * from a declared table, defaults and --quick defaults, the --help text
 * written from the same table, and exit status 2 with the flag named for a
 * bad value. Exits are checked in a child process (the parser ends the run).
 */
import { spawnSync } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { helpText, parseOptions, type OptionSpec } from '../dist/bench/args.js';

const argsJs = pathToFileURL(resolve(dirname(fileURLToPath(import.meta.url)), '..', 'dist', 'bench', 'args.js')).href;

const SPEC = {
  model: { type: 'string', default: 'tiny-embed', help: 'model folder' },
  report: { type: 'string', default: 'median', choices: ['median', 'best'], help: 'which round' },
  rounds: { type: 'int', min: 1, default: 3, quick: 1, help: 'rounds' },
  'duration-s': { type: 'number', min: 0.1, default: 2, help: 'seconds' },
  clients: { type: 'ints', min: 1, default: [1, 64], help: 'clients' },
  loads: { type: 'numbers', min: 1, quick: [25, 100], help: 'loads' },
  forms: { type: 'strings', default: ['text', 'ids'], choices: ['text', 'ids'], help: 'forms' },
  json: { type: 'string', value: 'PATH', help: 'raw results' },
  quick: { type: 'boolean', help: 'shorter defaults' },
} as const satisfies Record<string, OptionSpec>;

/** Runs the parser on `argv` in a child process: its exit status, output, and the values it printed. */
function runParser(argv: string[]) {
  const script = `import { parseOptions } from ${JSON.stringify(argsJs)};
    const spec = ${JSON.stringify(SPEC)};
    console.log(JSON.stringify(parseOptions('x [options]', spec, ${JSON.stringify(argv)})));`;
  const r = spawnSync(process.execPath, ['--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, stdout: r.stdout, stderr: r.stderr };
}

describe('bench/args parseOptions', () => {
  it('gives every option its declared default, typed, when nothing is given', () => {
    const o = parseOptions('x', SPEC, []);
    expect(o).toEqual({ model: 'tiny-embed', report: 'median', rounds: 3, 'duration-s': 2, clients: [1, 64], loads: undefined, forms: ['text', 'ids'], json: undefined, quick: false });
  });

  it('converts what is given: numbers, lists, choices', () => {
    const o = parseOptions('x', SPEC, ['--rounds', '5', '--duration-s=0.5', '--clients', '2, 8,,16', '--forms', 'ids', '--report', 'best', '--json', 'out.json']);
    expect(o.rounds).toBe(5);
    expect(o['duration-s']).toBe(0.5);
    expect(o.clients).toEqual([2, 8, 16]);
    expect(o.forms).toEqual(['ids']);
    expect(o.report).toBe('best');
    expect(o.json).toBe('out.json');
  });

  it('--quick switches to the quick defaults; a value given still wins', () => {
    expect(parseOptions('x', SPEC, ['--quick'])).toMatchObject({ quick: true, rounds: 1, loads: [25, 100], 'duration-s': 2 });
    expect(parseOptions('x', SPEC, ['--quick', '--rounds', '4']).rounds).toBe(4);
  });

  it('returns copies of list defaults, so a script that changes one cannot change the table', () => {
    const a = parseOptions('x', SPEC, []);
    a.clients.push(99);
    expect(parseOptions('x', SPEC, []).clients).toEqual([1, 64]);
  });

  it('writes --help from the table: every flag, its placeholder, default and quick default', () => {
    const text = helpText('x [options]', SPEC);
    expect(text.split('\n')[0]).toBe('usage: x [options]');
    expect(text).toMatch(/--rounds N\s+rounds \(default 3; quick 1\)/);
    expect(text).toMatch(/--clients LIST\s+clients \(default 1,64\)/);
    expect(text).toMatch(/--json PATH\s+raw results\n/);
    expect(text).toMatch(/--quick\s+shorter defaults\n/);
    const r = runParser(['--help']);
    expect(r.status).toBe(0);
    expect(r.stdout.trim()).toBe(text);
  });

  it.each([
    [['--rounds', '0'], /--rounds: expected an integer >= 1, got "0"/],
    [['--rounds', '1.5'], /--rounds: expected an integer >= 1/],
    [['--duration-s', 'abc'], /--duration-s: expected a number >= 0.1, got "abc"/],
    [['--clients', '1,x'], /--clients: expected an integer >= 1, got "x"/],
    [['--report', 'worst'], /--report: expected one of median, best, got "worst"/],
    [['--forms', 'text,tokens'], /--forms: expected one of text, ids, got "tokens"/],
    [['--nope'], /Unknown option '--nope'.*--help lists the options/],
    [['stray'], /positional/i],
  ])('exits 2 naming the flag for %j', (argv, message) => {
    const r = runParser(argv);
    expect(r.status).toBe(2);
    expect(r.stderr).toMatch(message);
    expect(r.stdout).toBe('');
  });

  it('prints the values it parsed in a child process too (the harness above works)', () => {
    const r = runParser(['--rounds', '7']);
    expect(r.status).toBe(0);
    expect(JSON.parse(r.stdout).rounds).toBe(7);
  });
});
