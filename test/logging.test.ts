/**
 * `slabserve serve` as a child process (dist/src/cli.js): the security and
 * logging flags and variables (--api-key-file, SLABSERVE_API_KEY,
 * SLABSERVE_METRICS_AUTH, --log-level, --log-format) and where the lines go: JSON events on
 * stderr, one JSON access line per request on stdout, written by the gateway
 * thread itself; none lost when the process drains and exits on SIGTERM.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { eventually } from './helpers.js';

const CLI = fileURLToPath(new URL('../dist/src/cli.js', import.meta.url));
const FILE_KEY = 'file-key-0123456789abcdef0123456789';
const ENV_KEY = 'env-key-fedcba9876543210fedcba9876';

const dir = mkdtempSync(join(tmpdir(), 'slabserve-logging-'));
const keyFile = join(dir, 'keys');
writeFileSync(keyFile, `# one key a line\n\n  ${FILE_KEY}  \n`);

/** The environment without SLABSERVE_* variables from this one, plus `extra`. */
function env(extra: Record<string, string>): NodeJS.ProcessEnv {
  return { ...Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SLABSERVE_'))), ...extra };
}

let child: ChildProcess;
let stdout = '';
let stderr = '';
let url = '';
let exited: Promise<number | null>;

const jsonLines = (text: string) =>
  text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Record<string, any>);

async function until<T>(what: string, probe: () => T | undefined, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline || child.exitCode !== null) throw new Error(`${what}: not seen; stderr:\n${stderr.slice(-2000)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

beforeAll(async () => {
  child = spawn(
    process.execPath,
    [CLI, 'serve', '--port', '0', '--host', '127.0.0.1', '--device', 'cpu', '--model', 'tiny-embed', '--buckets', '8,16', '--api-key-file', keyFile, '--log-level', 'info'],
    { env: env({ SLABSERVE_API_KEY: ENV_KEY, SLABSERVE_METRICS_AUTH: 'true' }), stdio: ['ignore', 'pipe', 'pipe'] },
  );
  exited = new Promise((res) => child.once('exit', (code) => res(code)));
  child.stdout!.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  child.stderr!.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  url = await until('listening', () => /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(stderr)?.[1]);
  await until('ready', () => (/slabserve: ready at /.test(stderr) ? true : undefined));
}, 120_000);

afterAll(() => {
  if (child && child.exitCode === null) child.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
});

const embed = (key: string | null, id: string) =>
  fetch(url + '/embed', {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-request-id': id, ...(key ? { authorization: `Bearer ${key}` } : {}) },
    body: JSON.stringify({ inputs: 'a body that is never logged' }),
  });

describe('slabserve serve: keys from a file and a variable, JSON logs on stderr and stdout', () => {
  it('a key from --api-key-file and one from SLABSERVE_API_KEY are both accepted; none is 401; SLABSERVE_METRICS_AUTH=true keys /metrics', async () => {
    expect((await embed(FILE_KEY, 'cli-file-key')).status).toBe(200);
    expect((await embed(ENV_KEY, 'cli-env-key')).status).toBe(200);
    expect((await embed(null, 'cli-no-key')).status).toBe(401);
    expect((await fetch(url + '/metrics')).status).toBe(401);
    expect((await fetch(url + '/metrics', { headers: { authorization: `Bearer ${ENV_KEY}` } })).status).toBe(200);
    expect((await fetch(url + '/livez')).status).toBe(200);
  });

  it('stdout: one JSON access line per request, from the gateway thread; stderr: JSON events', async () => {
    // A marker after the probes of the test before (/metrics twice, /livez): its line comes after theirs
    // would have (one gateway writes its lines in order), so once it is there, theirs would be too.
    expect((await embed(FILE_KEY, 'cli-marker')).status).toBe(200);
    const lines = await until('the access lines', () => {
      const all = jsonLines(stdout);
      return all.some((l) => l.req_id === 'cli-marker') ? all : undefined;
    });
    for (const l of lines) expect(l).toMatchObject({ msg: 'request', thread: 'gateway-0', pid: child.pid });
    expect(lines.find((l) => l.req_id === 'cli-file-key')).toMatchObject({ level: 'info', method: 'POST', route: '/embed', model: 'tiny-embed', status: 200 });
    expect(lines.find((l) => l.req_id === 'cli-no-key')).toMatchObject({ status: 401, code: 'SLABSERVE_UNAUTHORIZED' });
    // Health probes and metrics scrapes (the test asked /livez, /readyz and /metrics) get no line by default.
    expect(lines.filter((l) => ['/livez', '/readyz', '/health', '/metrics'].includes(l.route))).toEqual([]);
    const events = jsonLines(stderr);
    expect(events.length).toBeGreaterThanOrEqual(3);
    for (const e of events) expect(e).toMatchObject({ level: expect.any(String), time: expect.any(String), pid: child.pid, msg: expect.any(String) });
    expect(events.some((e) => e.thread === 'main' && /ready at/.test(e.msg))).toBe(true);
    for (const text of [stdout, stderr]) {
      expect(text).not.toContain(FILE_KEY);
      expect(text).not.toContain(ENV_KEY);
      expect(text).not.toContain('never logged');
    }
  });

  it('SIGTERM: drains and exits 0; the access line of the last request is there', async () => {
    expect((await embed(FILE_KEY, 'cli-last-request')).status).toBe(200);
    child.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(jsonLines(stdout).some((l) => l.req_id === 'cli-last-request')).toBe(true);
    expect(jsonLines(stderr).at(-1)!.msg).toMatch(/stopped/);
  }, 60_000);
});

describe('slabserve serve --log-probes (SLABSERVE_LOG_PROBES)', () => {
  it('gives health probes and metrics scrapes their access lines too', async () => {
    const probed = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--host', '127.0.0.1', '--device', 'cpu', '--model', 'tiny-embed', '--buckets', '8,16'], {
      env: env({ SLABSERVE_LOG_PROBES: 'true' }),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    probed.stdout!.setEncoding('utf8').on('data', (d: string) => (out += d));
    probed.stderr!.setEncoding('utf8').on('data', (d: string) => (err += d));
    const closed = new Promise((r) => probed.once('exit', r));
    try {
      const base = await eventually('listening', async () => /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(err)?.[1], (v) => v !== undefined, 60_000, () => err);
      for (const path of ['/livez', '/readyz', '/metrics', '/v2/health/live']) await (await fetch(base + path, { headers: { 'x-request-id': `probe${path}` } })).text();
      await eventually('the last probe\'s access line', async () => out, (o) => o.includes('probe/v2/health/live'));
      expect(jsonLines(out).map((l) => l.route)).toEqual(['/livez', '/readyz', '/metrics', '/v2/health/live']);
    } finally {
      probed.kill('SIGTERM');
      await closed;
    }
  }, 90_000);
});

describe('slabserve serve: bad security flags stop it at once with a clear message', () => {
  const run = (args: string[], extra: Record<string, string> = {}) =>
    spawnSync(process.execPath, [CLI, 'serve', '--port', '0', '--device', 'cpu', ...args], { env: env(extra), encoding: 'utf8', timeout: 30_000 });

  it('an unreadable key file, an empty one, a key with a space, a bad boolean, a bad level', () => {
    const empty = join(dir, 'empty');
    writeFileSync(empty, '# nothing\n');
    const cases: [string[], Record<string, string>, RegExp][] = [
      [['--api-key-file', join(dir, 'missing')], {}, /--api-key-file .*missing: cannot read it \(ENOENT\)/],
      [['--api-key-file', empty], {}, /no key in it/],
      [[], { SLABSERVE_API_KEY: 'has a space' }, /printable ASCII, without spaces/],
      [[], { SLABSERVE_METRICS_AUTH: 'maybe' }, /expected true or false/],
      [['--log-level', 'loud'], {}, /Allowed choices are fatal, error, warn, info, debug, trace, silent/],
    ];
    for (const [args, extra, message] of cases) {
      const r = run(args, extra);
      expect(r.status, `${args.join(' ')} ${JSON.stringify(extra)}: ${r.stderr}`).toBe(1);
      expect(r.stderr).toMatch(message);
      expect(r.stderr).not.toContain('has a space');
    }
  });
});

/** A line pino-pretty writes: `[HH:MM:SS.mmm] LEVEL: (thread) message`, colours stripped. */
const READABLE = /^\[\d\d:\d\d:\d\d\.\d{3}\] (TRACE|DEBUG|INFO|WARN|ERROR|FATAL): \((main|gateway-\d+)\) \S/;
const ANSI = /\x1b\[[0-9;]*m/g;

/**
 * `slabserve serve` under a pseudo-terminal (util-linux's `script`, from Debian's essential
 * bsdutils): stdout and stderr are the terminal. Resolves with what it printed once `until` matches;
 * the server is then ended (the terminal closes under it).
 */
async function serveOnTerminal(extraEnv: Record<string, string>, until: RegExp): Promise<string> {
  const command = [process.execPath, CLI, 'serve', '--port', '0', '--host', '127.0.0.1', '--device', 'cpu', '--model', 'tiny-embed'].map((a) => `'${a}'`).join(' ');
  const term = spawn('script', ['-qfec', `exec ${command}`, '/dev/null'], { env: env({ ...extraEnv, TERM: 'xterm-256color' }), stdio: ['pipe', 'pipe', 'pipe'] });
  let out = '';
  term.stdout!.setEncoding('utf8').on('data', (d: string) => (out += d));
  const gone = new Promise<void>((r) => term.once('close', () => r()));
  term.once('error', (err) => (out += `\nscript did not start: ${err.message} (apt-get install bsdutils)`));
  try {
    await eventually('the line on the terminal', async () => out, (o) => until.test(o.replace(ANSI, '')), 60_000, (o) => o.slice(-1500));
    return out;
  } finally {
    term.kill('SIGTERM');
    const guard = setTimeout(() => term.kill('SIGKILL'), 10_000);
    await gone;
    clearTimeout(guard);
  }
}

describe('--log-format (SLABSERVE_LOG_FORMAT): JSON for files and containers, readable lines for a person', () => {
  it('pretty: every event and access line readable, without colours where the output is no terminal', async () => {
    const p = spawn(process.execPath, [CLI, 'serve', '--port', '0', '--host', '127.0.0.1', '--device', 'cpu', '--model', 'tiny-embed', '--log-format', 'pretty'], { env: env({}), stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    p.stdout!.setEncoding('utf8').on('data', (d: string) => (out += d));
    p.stderr!.setEncoding('utf8').on('data', (d: string) => (err += d));
    const code = new Promise<number | null>((r) => p.once('exit', (c) => r(c)));
    try {
      const at = (await eventually('ready', async () => /\(main\) slabserve: ready at (http:\/\/\S+)/.exec(err), (m) => m !== null, 60_000, () => err.slice(-1500)))![1]!;
      const res = await fetch(at + '/embed', { method: 'POST', headers: { 'content-type': 'application/json', 'x-request-id': 'pretty-1' }, body: JSON.stringify({ inputs: 'hi' }) });
      expect(res.status).toBe(200);
      await eventually('its access line', async () => out, (o) => o.includes('pretty-1'));
      p.kill('SIGTERM');
      expect(await code).toBe(0);
    } finally {
      if (p.exitCode === null) p.kill('SIGKILL');
    }
    const lines = (text: string) => text.split('\n').filter((l) => l !== '');
    for (const l of [...lines(err), ...lines(out)]) expect(l, l).toMatch(READABLE);
    expect(err + out).not.toMatch(ANSI);
    expect(lines(out).find((l) => l.includes('pretty-1'))).toMatch(/INFO: \(gateway-0\) request \{.*"status":200/);
    expect(lines(err).at(-1)).toMatch(/\(main\) slabserve: stopped/);
  });

  it('auto (the default): readable, coloured lines on a terminal; json there when asked', async () => {
    const auto = (await serveOnTerminal({}, /slabserve: ready at/)).split(/\r?\n/).filter((l) => l !== '');
    expect(auto.join('\n')).toMatch(ANSI);
    for (const l of auto) expect(l.replace(ANSI, ''), l).toMatch(READABLE);
    const json = (await serveOnTerminal({ SLABSERVE_LOG_FORMAT: 'json' }, /slabserve: ready at/)).split(/\r?\n/).filter((l) => l !== '');
    for (const l of json) expect(JSON.parse(l), l).toMatchObject({ level: expect.any(String), msg: expect.any(String), thread: expect.any(String) });
  });

  it('an unknown format is refused', () => {
    const r = spawnSync(process.execPath, [CLI, 'serve', '--port', '0', '--device', 'cpu', '--log-format', 'loud'], { env: env({}), encoding: 'utf8', timeout: 30_000 });
    expect(r.status).toBe(1);
    expect(r.stderr).toMatch(/Allowed choices are auto, json, pretty/);
  });
});
