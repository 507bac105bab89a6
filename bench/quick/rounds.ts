/**
 * bench:quick's phases in order, run `rounds` times in alternating order
 * (A B C ... C B A A B C ...) so slow drift of a noisy machine hits every
 * configuration alike, and the round each row reports (median or best by
 * sequences/s) with the spread between rounds.
 */
import type { Workload } from '../workloads.js';
import type { QuickOptions } from './options.js';
import { runEngine, runRaw, runServer, type PhaseResult } from './phases.js';
import { HTTP_BATCHED, RAW_BATCHES, type Rig } from './rig.js';
import type { Seq } from './workload.js';

/** Row names: the engine at `c` callers, a server at `c` clients, a WebSocket configuration. */
export const engineAt = (o: QuickOptions, c: number) => (c === o.concurrency ? 'engine batched' : `engine batched c=${c}`);
export const httpAt = (name: string, c: number) => `${name} c=${c}`;
export const wsName = (sockets: number, depth: number) => `ws ${sockets}x${depth}`;

export interface Phase {
  name: string;
  run(round: number): Promise<PhaseResult>;
}

/** Every phase of the run: raw, the engines, the engine at each other client count, the servers, WebSocket. */
export function phaseList(o: QuickOptions, rig: Rig, seqs: Seq[], workload: Workload): Phase[] {
  const raw = (name: string, session: Rig['rawSession'], b: number): Phase => ({ name, run: (round) => runRaw(o, name, round, session, rig.rawSets.get(b)!) });
  const engine = (name: string, engineName: string, c: number): Phase => ({ name, run: (round) => runEngine(o, name, round, rig.engines.get(engineName)!, seqs, c) });
  return [
    ...RAW_BATCHES.map((b) => raw(`raw b=${b}`, rig.rawSession, b)),
    ...[...rig.rawAlt].map(([intra, session]) => raw(`raw b=32 intra=${intra}`, session, 32)),
    ...rig.engineConfigs.map((c) => engine(c.name, c.name, o.concurrency)),
    // the in-process reference for each HTTP client count the engine rows above do not cover
    ...(o.http && o.engines ? o.httpClients.filter((c) => c !== o.concurrency).map((c) => engine(engineAt(o, c), 'engine batched', c)) : []),
    ...o.httpClients.flatMap((c) =>
      [...rig.servers].map(([name, server]): Phase => ({ name: httpAt(name, c), run: (round) => runServer(o, httpAt(name, c), round, server, workload, c) })),
    ),
    ...(o.ws
      ? o.wsConfigs.map(({ sockets, depth }): Phase => ({
          name: wsName(sockets, depth),
          run: (round) => runServer(o, wsName(sockets, depth), round, rig.servers.get(HTTP_BATCHED)!, workload, sockets * depth, { sockets, depth, rowBytes: rig.wsRowBytes }),
        }))
      : []),
  ];
}

/** Runs every phase `rounds` times, alternating the order; a line of seq/s per round on stderr. */
export async function runRounds(o: QuickOptions, phases: Phase[]): Promise<PhaseResult[]> {
  const all: PhaseResult[] = [];
  for (let round = 0; round < o.rounds; round++) {
    const order = round % 2 === 0 ? phases : [...phases].reverse();
    const line: string[] = [];
    for (const p of order) {
      const res = await p.run(round);
      all.push(res);
      line.push(`${p.name} ${res.seqPerSec.toFixed(0)}`);
    }
    console.error(`round ${round + 1}/${o.rounds} (seq/s): ${line.join(', ')}`);
  }
  return all;
}

export type Reported = PhaseResult & { spreadPct: number; roundsSeqPerSec: number[] };

/** The reported round per configuration (median or best by seq/s) and the spread between rounds. */
export function reportedRounds(o: QuickOptions, phases: Phase[], all: PhaseResult[]): Map<string, Reported> {
  const best = new Map<string, Reported>();
  for (const p of phases) {
    const runs = all.filter((x) => x.config === p.name).sort((a, b) => a.seqPerSec - b.seqPerSec);
    // median: the middle round (the faster middle one for an even count)
    const pick = o.report === 'best' ? runs[runs.length - 1]! : runs[Math.floor(runs.length / 2)]!;
    const hi = runs[runs.length - 1]!.seqPerSec;
    const lo = runs[0]!.seqPerSec;
    best.set(p.name, { ...pick, spreadPct: (100 * (hi - lo)) / hi, roundsSeqPerSec: all.filter((x) => x.config === p.name).map((x) => x.seqPerSec) });
  }
  return best;
}

/** `a / b` seq/s round by round, for two rows that ran in every round. */
export function ratioByRound(o: QuickOptions, all: PhaseResult[], a: string, b: string): number[] {
  const find = (name: string, round: number) => all.find((x) => x.config === name && x.round === round)!.seqPerSec;
  return Array.from({ length: o.rounds }, (_, round) => find(a, round) / find(b, round));
}
