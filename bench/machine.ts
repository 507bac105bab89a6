/** The machine a terminal bench ran on, as bench:quick and bench:scheduling print it and write it to --json. */
import { createRequire } from 'node:module';
import { cpus, loadavg, totalmem } from 'node:os';

export interface Machine {
  cpu: string;
  cores: number;
  memoryGiB: number;
  node: string;
  onnxruntime: string;
  platform: string;
  /** 1, 5 and 15-minute load averages at the start: how busy the shared machine was. */
  loadavg: number[];
}

export function describeMachine(): Machine {
  const require = createRequire(import.meta.url);
  return {
    cpu: cpus()[0]?.model ?? 'unknown',
    cores: cpus().length,
    memoryGiB: Math.round(totalmem() / 2 ** 30),
    node: process.version,
    onnxruntime: (require('onnxruntime-node/package.json') as { version: string }).version,
    platform: `${process.platform}-${process.arch}`,
    loadavg: loadavg().map((x) => Number(x.toFixed(2))),
  };
}

/** The `machine: ...` line. */
export function machineLine(m: Machine): string {
  return `machine: ${m.cpu}, ${m.cores} cores, ${m.memoryGiB} GiB, node ${m.node}, onnxruntime-node ${m.onnxruntime}, ${m.platform}, loadavg ${m.loadavg.join(' ')}`;
}
