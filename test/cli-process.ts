/**
 * `slabserve serve` in a child process, as the tests that need a real
 * process (signals, exit codes, the CLI's own flag handling) start it: on a
 * free loopback port, CPU, tiny-embed, its stderr gathered, a SIGKILL guard
 * so a hung child never outlives the test, and ready once /readyz answers 200.
 */
import { spawn, spawnSync } from 'node:child_process';
import http from 'node:http';
import net from 'node:net';
import { fileURLToPath } from 'node:url';
import { eventually } from './helpers.js';

export const CLI = fileURLToPath(new URL('../dist/src/cli.js', import.meta.url));

/**
 * `slabserve serve` with each of `cases` (flags, variables): it must stop at once, status 1, with
 * stderr matching `message`. Throws (an assertion) naming the case otherwise.
 */
export function expectCliRefuses(cases: [args: string[], env: Record<string, string>][], message: RegExp): void {
  for (const [args, env] of cases) {
    const r = spawnSync(process.execPath, [CLI, 'serve', '--port', '0', '--device', 'cpu', ...args], { env: { ...process.env, ...env }, encoding: 'utf8', timeout: 30_000 });
    const what = `${args.join(' ')} ${JSON.stringify(env)}: status ${r.status}, ${r.stderr}`;
    if (r.status !== 1 || !message.test(r.stderr)) throw new Error(`expected the CLI to refuse ${what}`);
  }
}

export interface CliServer {
  port: number;
  pid: number;
  /** The child's exit: code, signal, and performance.now() when it was seen. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>;
  stderr(): string;
  kill(signal: NodeJS.Signals): void;
}

/** GET `path` on a fresh connection closed afterwards (no keep-alive socket left to the server): the status, or the error's code. */
export function getStatus(port: number, path: string, timeoutMs = 2000): Promise<number | string> {
  return new Promise((resolve) => {
    const req = http.get({ host: '127.0.0.1', port, path, agent: false, headers: { connection: 'close' } }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode!));
    });
    req.setTimeout(timeoutMs, () => req.destroy(Object.assign(new Error('timeout'), { code: 'TIMEOUT' })));
    req.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
  });
}

/**
 * A free port below the kernel's ephemeral range (32768 and up). The servers that tests start with
 * port 0 take ports from that range, and a port this file picked (free when picked, bound by the
 * child a second later) could meanwhile be handed to one of them: both would then bind it with
 * SO_REUSEPORT and share it (a readiness probe answered by the other server, a SIGTERM sent before
 * the child listened). Random in 20000-29999, checked free.
 */
export async function portOutsideEphemeral(): Promise<number> {
  for (;;) {
    const port = 20000 + Math.floor(Math.random() * 10000);
    const free = await new Promise<boolean>((resolve) => {
      const probe = net.createServer();
      probe.once('error', () => resolve(false));
      probe.listen({ port, host: '127.0.0.1', exclusive: true }, () => probe.close(() => resolve(true)));
    });
    if (free) return port;
  }
}

/**
 * Starts `slabserve serve --host 127.0.0.1 --port P --device cpu --model tiny-embed ...args`
 * and resolves once it is ready. `env` is added to this process's environment (a variable
 * given as undefined is left out); `run` turns node's arguments into the command that runs
 * them (default: this process's node).
 */
export async function serveCli(
  args: string[],
  opts: { env?: Record<string, string | undefined>; readyWithinMs?: number; killAfterMs?: number; run?: (nodeArgs: string[]) => [string, string[]] } = {},
): Promise<CliServer> {
  const port = await portOutsideEphemeral();
  // gRPC on a port of its own too (`args` may name another: the last one given counts). Without it a
  // fixed --port puts gRPC on the default 8081, which every such server in the suite would share.
  let grpcPort = await portOutsideEphemeral();
  while (grpcPort === port) grpcPort = await portOutsideEphemeral();
  const [command, argv] = (opts.run ?? ((a) => [process.execPath, a]))([CLI, 'serve', '--host', '127.0.0.1', '--port', String(port), '--grpc-port', String(grpcPort), '--device', 'cpu', '--model', 'tiny-embed', ...args]);
  const child = spawn(command, argv, {
    stdio: ['ignore', 'ignore', 'pipe'],
    env: { ...process.env, ...opts.env },
  });
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>((r) => child.on('exit', (code, signal) => r({ code, signal, at: performance.now() })));
  const guard = setTimeout(() => child.kill('SIGKILL'), opts.killAfterMs ?? 90_000);
  void exited.then(() => clearTimeout(guard));
  await eventually('the server ready', () => getStatus(port, '/readyz'), (s) => s === 200, opts.readyWithinMs ?? 60_000, (s) => ({ readyz: s, stderr: stderr.slice(-500) }));
  return { port, pid: child.pid!, exited, stderr: () => stderr, kill: (signal) => void child.kill(signal) };
}
