/**
 * wrk, the C load generator (apt-get install wrk), as the HTTP load of the
 * benches: it costs about 30 us of client CPU a request where a Node client
 * costs 180, so more of the 2 cores are the server's. Its CPU is read from
 * bash's `times` after it exits. wrkWorkload() sends a workload's bodies in
 * turn, closed loop, and reads the latency at every 0.1 percentile back.
 */
import { spawn, spawnSync } from 'node:child_process';
import { rmSync, writeFileSync } from 'node:fs';

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

/** wrk's threads for `connections`: two (one a core), never more than the connections. */
const wrkThreads = (connections: number) => Math.min(2, connections);

/** wrk's command line under bash, followed by `times`, which then says the CPU its child (wrk) used. */
function wrkCommand(origin: string, connections: number, seconds: number, args: string): string {
  return `wrk -t${wrkThreads(connections)} -c${connections} -d${seconds}s ${args} ${origin} && times`;
}

/** The CPU ms wrk used, from `times`' second line (children's user and system); null when the output has none. */
function childCpuMs(out: string): number | null {
  const t = /\n(\d+)m([\d.]+)s (\d+)m([\d.]+)s\s*$/.exec(out);
  return t ? (Number(t[1]) * 60 + Number(t[2]) + Number(t[3]) * 60 + Number(t[4])) * 1000 : null;
}

/** Whether wrk is on the PATH (`wrk --version` prints its banner and exits 1). */
export function wrkInstalled(): boolean {
  return /^wrk /.test(spawnSync('wrk', ['--version'], { encoding: 'utf8' }).stdout ?? '');
}

/** What running without wrk costs, for the warning the benches print then. */
export const NODE_GENERATOR_COST =
  'the Node load generator runs instead: it spends about 179 us of CPU per request on this 2-core machine against wrk\'s 31, CPU the server under test does not get (apt-get install wrk)';

/** A workload run by wrkWorkload(). Latencies in microseconds. */
export interface WrkWorkloadRun {
  /** Answers received, of any status. */
  requests: number;
  seconds: number;
  /** Answers other than 2xx/3xx. */
  non2xx: number;
  /** Socket errors by kind (connect, read, write, timeout): requests lost, not answered. */
  socketErrors: Record<string, number>;
  clientCpuMs: number;
  /** The latency at percentiles 0.1, 0.2, ... 100 (1000 values; the last is the maximum). */
  quantilesUs: number[];
}

/**
 * The Lua for wrkWorkload(): POST /embed of `bodies` in turn, each wrk thread
 * from its own place (the first from `first`), and a summary line at the end.
 */
export function workloadScript(bodies: Buffer[], o: { first: number; threads: number; path: string; traceparent?: number | undefined }): string {
  // Long brackets of a level no body contains: the bodies go in as they are, no escaping.
  let level = 0;
  const texts = bodies.map((b) => b.toString('utf8'));
  while (texts.some((t) => t.includes(`]${'='.repeat(level)}]`))) level++;
  const [open, close] = [`[${'='.repeat(level)}[`, `]${'='.repeat(level)}]`];
  const stride = Math.max(1, Math.floor(bodies.length / o.threads));
  const hex = (n: number) => Array(n).fill("string.format('%08x', math.random(0, 2147483647))").join(' .. ');
  const parent = o.traceparent === undefined ? '' : `headers["traceparent"] = '00-' .. ${hex(4)} .. '-' .. ${hex(2)} .. (math.random() < ${o.traceparent} and '-01' or '-00')`;
  return `local bodies = {
${texts.map((t) => `${open}${t}${close},`).join('\n')}
}
local n = #bodies
local headers = {["Content-Type"] = "application/json"}
local started = 0
setup = function(thread)
  thread:set("offset", (${o.first} + started * ${stride}) % n)
  started = started + 1
end
local i = 0
request = function()
  local k = (offset + i) % n + 1
  i = i + 1
  ${parent}
  return wrk.format("POST", "${o.path}", headers, bodies[k])
end
done = function(summary, latency, requests)
  local q = {}
  for p = 1, 999 do q[p] = latency:percentile(p / 10) end
  q[1000] = latency.max -- percentile(100) asks for one more than there are
  local e = summary.errors
  io.write(string.format('SLABSERVE_WRK {"requests":%d,"durationUs":%d,"non2xx":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,"quantilesUs":[%s]}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout, table.concat(q, ",")))
end
`;
}

/** wrk's closed loop over a workload's bodies (workloadScript) for `seconds` (whole seconds: wrk's unit). */
export async function wrkWorkload(
  origin: string,
  bodies: Buffer[],
  opts: { connections: number; seconds: number; timeoutMs: number; first: number; path: string; traceparent?: number | undefined; scriptPath: string },
): Promise<WrkWorkloadRun> {
  writeFileSync(opts.scriptPath, workloadScript(bodies, { ...opts, threads: wrkThreads(opts.connections) }));
  const timeoutS = Math.max(1, Math.ceil(opts.timeoutMs / 1000));
  let out: string;
  try {
    out = await run('bash', ['-c', wrkCommand(origin, opts.connections, opts.seconds, `--timeout ${timeoutS}s -s ${opts.scriptPath}`)]);
  } finally {
    rmSync(opts.scriptPath, { force: true }); // one per run: a bench process must not leave its bodies in /tmp
  }
  const line = /^SLABSERVE_WRK (.*)$/m.exec(out);
  const clientCpuMs = childCpuMs(out);
  if (!line || clientCpuMs === null) throw new Error(`cannot read wrk's output:\n${out}`);
  const r = JSON.parse(line[1]!) as { requests: number; durationUs: number; non2xx: number; connect: number; read: number; write: number; timeout: number; quantilesUs: number[] };
  return {
    requests: r.requests,
    seconds: r.durationUs / 1e6,
    non2xx: r.non2xx,
    socketErrors: { connect: r.connect, read: r.read, write: r.write, timeout: r.timeout },
    clientCpuMs,
    quantilesUs: r.quantilesUs,
  };
}
