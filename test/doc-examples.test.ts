/**
 * Every fenced code block of the repository's Markdown (every .md outside node_modules and dist)
 * runs as written, or says in the Markdown why it cannot:
 *
 *   ts, js       typechecked (ts: with the project's compiler options), then run with node against
 *                a real server started here; `import ... from 'slabserve/client'` resolves through
 *                package.json's "exports" (the files are written inside the repository)
 *   sh, bash     run with bash -e against the same server; a curl must get a 2xx answer
 *   json, yaml   parsed
 *   text, none   not run (tables, diagrams, protocol shapes, sample output), unless it looks like
 *                commands: then it needs a shell language and runs, or a marker
 *
 * A block that cannot run here (installs, Docker, Kubernetes, a GPU, a server or benchmark that
 * runs for minutes) has an HTML comment on the line before it, which GitHub does not show:
 *
 *   <!-- not run: needs Docker -->
 *
 * The one change made to a block before it runs: `localhost:8080` becomes the test server's address.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { toolOnPath } from './fixtures/system-tools.js';
import { parse as parseYaml } from 'yaml';
import { startServer } from '../dist/src/main/server.js';
import { testServerConfig } from './helpers.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const SKIPPED_DIRS = new Set(['node_modules', 'dist', '.git']);
/** A block gets this long to run; only a hang comes near it. */
const RUN_TIMEOUT_MS = 30_000;
/** The address the examples are written for. */
const EXAMPLE_ADDRESS = 'localhost:8080';

interface Block {
  /** Path from the repository root, and the line of the opening fence (1-based). */
  file: string;
  line: number;
  lang: string;
  code: string;
  /** The reason of a `<!-- not run: reason -->` on the line before it ('' if it gives none); null without one. */
  notRun: string | null;
}

/** Every .md under the repository root, outside SKIPPED_DIRS, sorted. */
function markdownFiles(dir = root): string[] {
  const found: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory() && !SKIPPED_DIRS.has(entry.name)) found.push(...markdownFiles(path));
    else if (entry.isFile() && entry.name.endsWith('.md')) found.push(relative(root, path));
  }
  return found.sort();
}

const FENCE = /^(\s*)(`{3,}|~{3,})\s*([^`]*)$/;
const NOT_RUN = /^<!--\s*not run\b:?(.*?)-->$/;

/** The fenced blocks of one Markdown file (CommonMark's rules, as far as these files need them). */
function fencedBlocks(file: string): Block[] {
  const lines = readFileSync(join(root, file), 'utf8').split('\n');
  const blocks: Block[] = [];
  for (let i = 0; i < lines.length; i++) {
    const open = FENCE.exec(lines[i]!);
    if (!open) continue;
    const [, indent, fence, info] = open as unknown as [string, string, string, string];
    let end = i + 1;
    while (end < lines.length && !isClosingFence(lines[end]!, fence)) end++;
    const body = lines.slice(i + 1, end).map((l) => l.replace(new RegExp(`^ {0,${indent.length}}`), ''));
    let before = i - 1;
    while (before >= 0 && lines[before]!.trim() === '') before--;
    const marker = before >= 0 ? NOT_RUN.exec(lines[before]!.trim()) : null;
    blocks.push({ file, line: i + 1, lang: info.trim().split(/\s+/)[0]!.toLowerCase(), code: body.join('\n'), notRun: marker ? marker[1]!.trim() : null });
    i = end;
  }
  return blocks;
}

function isClosingFence(line: string, fence: string): boolean {
  const t = line.trim();
  return t.length >= fence.length && t === fence[0]!.repeat(t.length);
}

type Plan =
  | { kind: 'node'; typescript: boolean }
  | { kind: 'bash' }
  | { kind: 'json' | 'yaml' }
  | { kind: 'text' }
  | { kind: 'not run'; reason: string }
  | { kind: 'problem'; why: string };

const NODE_LANGS: Record<string, boolean> = { ts: true, typescript: true, mts: true, js: false, javascript: false, mjs: false };
const SHELL_LANGS = new Set(['sh', 'bash', 'shell']);
const TEXT_LANGS = new Set(['', 'text', 'txt', 'plaintext']);
/** First words that make a text block a list of commands. */
const COMMANDS = new Set(['npm', 'npx', 'node', 'slabserve', 'curl', 'docker', 'kubectl', 'bash', 'sh', 'pip', 'optimum-cli', 'git', 'env', 'python', 'python3']);
/**
 * The only commands a shell block may run here: requests to the server. Anything else (npm ci, a build,
 * the model generator, a benchmark) would change or outlast what this suite runs on: it needs a marker.
 */
const SHELL_RUNNABLE = new Set(['curl']);

/**
 * The first word of each command of a shell text (past a `$ ` prompt and VAR=value), comments and
 * continued lines left out; `chained`: also the commands after &&, ||, ; and | on a line.
 */
function commandsOf(code: string, chained: boolean): string[] {
  const commands: string[] = [];
  let continued = false;
  for (const line of code.split('\n')) {
    const text = line.replace(/(^|\s)#.*$/, '').trim();
    if (!continued && text !== '') {
      for (const part of chained ? text.replace(/^\$\s+/, '').split(/&&|\|\||;|\|/) : [text.replace(/^\$\s+/, '')]) {
        const word = part.trim().split(/\s+/).find((w) => !/^[A-Za-z_][A-Za-z0-9_]*=/.test(w));
        if (word) commands.push(word);
      }
    }
    continued = text.endsWith('\\');
  }
  return commands;
}

function planOf(block: Block): Plan {
  if (block.notRun !== null) {
    return block.notRun === '' ? { kind: 'problem', why: 'marked not run without a reason: <!-- not run: why -->' } : { kind: 'not run', reason: block.notRun };
  }
  if (block.lang in NODE_LANGS) return { kind: 'node', typescript: NODE_LANGS[block.lang]! };
  if (SHELL_LANGS.has(block.lang)) {
    const other = commandsOf(block.code, true).filter((c) => !SHELL_RUNNABLE.has(c));
    if (other.length === 0) return { kind: 'bash' };
    return { kind: 'problem', why: `runs ${[...new Set(other)].join(', ')}: only ${[...SHELL_RUNNABLE].join(', ')} runs here; mark it <!-- not run: why -->` };
  }
  if (block.lang === 'json') return { kind: 'json' };
  if (block.lang === 'yaml' || block.lang === 'yml') return { kind: 'yaml' };
  if (TEXT_LANGS.has(block.lang)) {
    const command = commandsOf(block.code, false).find((w) => COMMANDS.has(w));
    if (command === undefined) return { kind: 'text' };
    return { kind: 'problem', why: `looks like commands (${command}): make it \`\`\`sh so it runs, or mark it <!-- not run: why -->` };
  }
  return { kind: 'problem', why: `no way to run a \`${block.lang}\` block here: mark it <!-- not run: why -->` };
}

const files = markdownFiles();
const blocks = files.flatMap(fencedBlocks).map((block) => ({ block, plan: planOf(block) }));
const where = (b: Block) => `${b.file}:${b.line}`;
const withPlan = <K extends Plan['kind']>(kind: K) => blocks.filter((b) => b.plan.kind === kind).map(({ block }) => [where(block), block] as const);

describe('code blocks in the Markdown', () => {
  it('reads every Markdown file of the repository', () => {
    expect(files).toEqual(expect.arrayContaining(['README.md', 'docs/websocket.md', 'models/README.md', 'bench/README.md', 'test/soak/README.md']));
    expect(files.some((f) => f.startsWith('node_modules') || f.startsWith('dist'))).toBe(false);
    expect(withPlan('node').length).toBeGreaterThan(0);
    expect(withPlan('bash').length).toBeGreaterThan(0);
  });

  it('every block runs here, is data, or is marked not run with a reason', () => {
    const problems = blocks.flatMap(({ block, plan }) => (plan.kind === 'problem' ? [`${where(block)} (\`\`\`${block.lang}): ${plan.why}`] : []));
    expect(problems).toEqual([]);
  });

  it.each(withPlan('json'))('%s parses as JSON', (_, block) => {
    expect(() => JSON.parse(block.code)).not.toThrow();
  });

  it.each(withPlan('yaml'))('%s parses as YAML', (_, block) => {
    expect(() => parseYaml(block.code)).not.toThrow();
  });
});

// ---- running them -----------------------------------------------------------

interface Outcome {
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  timedOut: boolean;
}

function run(command: string, args: string[], env: Record<string, string> = {}): Promise<Outcome> {
  return new Promise((resolve) => {
    execFile(command, args, { cwd: root, timeout: RUN_TIMEOUT_MS, killSignal: 'SIGKILL', env: { ...process.env, ...env } }, (err, stdout, stderr) => {
      const e = err as (NodeJS.ErrnoException & { code?: number | string; killed?: boolean; signal?: string }) | null;
      resolve({ code: e ? (typeof e.code === 'number' ? e.code : null) : 0, signal: e?.signal ?? null, stdout, stderr, timedOut: Boolean(e?.killed) });
    });
  });
}

/** Fails with the block's place, how it ended and what it printed. */
function expectRan(block: Block, o: Outcome): void {
  if (o.code === 0) return;
  const how = o.timedOut ? `still running after ${RUN_TIMEOUT_MS / 1000} s (does it close what it opens?)` : `exited ${o.code ?? o.signal}`;
  const tail = (s: string) => s.trim().slice(-4000) || '(nothing)';
  throw new Error(`${where(block)} (\`\`\`${block.lang}) ${how}\n--- stderr\n${tail(o.stderr)}\n--- stdout\n${tail(o.stdout)}`);
}

/** Type errors of the TypeScript blocks, by path, under the project's compiler options. */
function typeErrors(paths: string[]): Map<string, string[]> {
  const config = ts.getParsedCommandLineOfConfigFile(join(root, 'tsconfig.json'), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} });
  const options: ts.CompilerOptions = { ...config!.options, noEmit: true, declaration: false, sourceMap: false, rootDir: undefined, outDir: undefined };
  const program = ts.createProgram(paths, options);
  const errors = new Map<string, string[]>();
  for (const d of ts.getPreEmitDiagnostics(program)) {
    const file = d.file?.fileName ?? '(no file)';
    const line = d.file && d.start !== undefined ? d.file.getLineAndCharacterOfPosition(d.start).line + 1 : 0;
    errors.set(file, [...(errors.get(file) ?? []), `line ${line} of the block: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`]);
  }
  return errors;
}

describe('code blocks run as written, against a real server', () => {
  let server: Awaited<ReturnType<typeof startServer>>;
  let address: string;
  /** Inside the repository, so that 'slabserve' and 'slabserve/client' resolve to this package. */
  let dir: string;
  let checked: Map<string, string[]>;
  const sourceOf = (block: Block, ext: string) => join(dir, `${block.file.replace(/[/.]/g, '_')}-L${block.line}.${ext}`);

  beforeAll(async () => {
    toolOnPath('curl'); // the README's examples are curl commands
    server = await startServer(testServerConfig({ models: undefined })); // every model in models/, as `npm start` serves
    await server.ready;
    address = new URL(server.url).host;
    dir = mkdtempSync(join(root, '.doc-examples-'));
    // curl reads this before its arguments: a non-2xx answer is an exit 22 and shows its body.
    writeFileSync(join(dir, '.curlrc'), 'fail-with-body\nshow-error\n');
    const typescript = withPlan('node').filter(([, b]) => NODE_LANGS[b.lang]);
    for (const [, block] of typescript) writeFileSync(sourceOf(block, 'mts'), block.code.replaceAll(EXAMPLE_ADDRESS, address));
    checked = typeErrors(typescript.map(([, b]) => sourceOf(b, 'mts')));
  });
  afterAll(async () => {
    if (dir) rmSync(dir, { recursive: true, force: true });
    await server?.close();
  });

  it.each(withPlan('node'))('%s runs with node', async (_, block) => {
    const code = block.code.replaceAll(EXAMPLE_ADDRESS, address);
    let js = code;
    if (NODE_LANGS[block.lang]) {
      expect(checked.get(sourceOf(block, 'mts')) ?? [], `${where(block)} typechecks`).toEqual([]);
      js = ts.transpileModule(code, { compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 } }).outputText;
    }
    writeFileSync(sourceOf(block, 'mjs'), js);
    expectRan(block, await run(process.execPath, [sourceOf(block, 'mjs')]));
  });

  it.each(withPlan('bash'))('%s runs with bash', async (_, block) => {
    writeFileSync(sourceOf(block, 'sh'), block.code.replaceAll(EXAMPLE_ADDRESS, address));
    expectRan(block, await run('bash', ['-e', '-o', 'pipefail', sourceOf(block, 'sh')], { CURL_HOME: dir }));
  });
});

describe('the README on the command line', () => {
  it('`npx slabserve serve --help` runs after the build and lists every flag of the configuration tables', async () => {
    const readme = readFileSync(join(root, 'README.md'), 'utf8');
    expect(readme.includes('`npx slabserve serve --help` lists every option'), 'README.md says `npx slabserve serve --help` lists every option').toBe(true);
    const help = await run('npx', ['slabserve', 'serve', '--help']);
    expect(help.code, help.stderr).toBe(0);
    /** The flags of a table's rows (first cell), in the part of `text` from the heading `from` to `to` (or the end). */
    const flagsOf = (text: string, from: string, to?: string) => {
      expect(text.indexOf(from), `heading ${from}`).toBeGreaterThanOrEqual(0);
      const table = text.slice(text.indexOf(from), to === undefined ? undefined : text.indexOf(to));
      return table.split('\n').flatMap((row) => (row.startsWith('| `--') ? (row.split('|')[1]!.match(/--[a-z0-9-]+/g) ?? []) : []));
    };
    // The full table is docs/configuration.md's; the README has the few flags people change most.
    const flags = flagsOf(readFileSync(join(root, 'docs', 'configuration.md'), 'utf8'), '## Every option');
    expect(flags.length).toBeGreaterThan(20);
    const readmeFlags = flagsOf(readme, '## Configuration', '## Operations');
    expect(readmeFlags.length).toBeGreaterThan(0);
    expect([...flags, ...readmeFlags].filter((f) => !new RegExp(`${f}(?![a-z0-9-])`).test(help.stdout))).toEqual([]);
    // The default buckets it states are the ones a server uses (it said "powers of two" while /info showed 8,12,16,20,...).
    const stated = /--buckets[\s\S]*?default:[^)]*?(\d+(?:,\d+)+)/.exec(help.stdout.replace(/\s+/g, ' '))?.[1];
    expect(stated, help.stdout).toBeDefined();
    const server = await startServer(testServerConfig({ models: ['tiny-embed'] }));
    await server.ready;
    try {
      const used = ((await (await fetch(server.url + '/info')).json()) as { models: { batching: { buckets: number[] } }[] }).models[0]!.batching.buckets;
      expect(used.slice(0, stated!.split(',').length).join(',')).toBe(stated);
    } finally {
      await server.close();
    }
  });
});
