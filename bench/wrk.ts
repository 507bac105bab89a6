/**
 * wrk, the C load generator (apt-get install wrk), as the HTTP load of the
 * benches that compare routes or transports: it costs about 30 us of client
 * CPU a request where a Node client costs 180, so more of the 2 cores are the
 * server's. Its CPU is read from bash's `times` after it exits.
 */
import { spawn } from 'node:child_process';

export interface Load {
  requests: number;
  seconds: number;
  p99Ms: number;
  /** The load generator's own CPU over the window, ms. */
  clientCpuMs: number;
}

/** Runs a command to its end; its stdout, or an error with the end of its stderr. */
export function run(cmd: string, args: string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`${cmd} exited ${code}: ${err.slice(-500)}`))));
  });
}

/** wrk under bash, whose `times` then says the CPU its child (wrk) used. `script` is a Lua file's path. */
export async function wrk(origin: string, seconds: number, connections: number, script: string): Promise<Load> {
  const out = await run('bash', ['-c', `wrk -t${Math.min(2, connections)} -c${connections} -d${seconds}s --latency -s ${script} ${origin} && times`]);
  const ms = (v: string, unit: string) => Number(v) * (unit === 'us' ? 1e-3 : unit === 's' ? 1e3 : 1);
  const p99 = /99%\s+([\d.]+)(us|ms|s)/.exec(out);
  const total = /(\d+) requests in ([\d.]+)s/.exec(out);
  const children = /\n(\d+)m([\d.]+)s (\d+)m([\d.]+)s\s*$/.exec(out); // times' second line: children's user and system
  if (!p99 || !total || !children) throw new Error(`cannot read wrk's output:\n${out}`);
  const errors = /Non-2xx or 3xx responses: (\d+)/.exec(out);
  if (errors) throw new Error(`wrk: ${errors[1]} requests were not answered 2xx:\n${out}`);
  const clientCpuMs = (Number(children[1]) * 60 + Number(children[2]) + Number(children[3]) * 60 + Number(children[4])) * 1000;
  return { requests: Number(total[1]), seconds: Number(total[2]), p99Ms: ms(p99[1]!, p99[2]!), clientCpuMs };
}

/** wrk's Lua for POSTs of `body(n)` to `path`: `bodyLua` is a Lua expression of `counter` (and `wrk.thread`), distinct per request. */
export function postScript(path: string, bodyLua: string): string {
  return `counter = 0
request = function()
  counter = counter + 1
  local body = ${bodyLua}
  return wrk.format("POST", "${path}", {["Content-Type"] = "application/json"}, body)
end
`;
}

export const median = (v: number[]) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)]!;
