/**
 * The machine a bench runs on: what results.json records (MachineInfo, the
 * suite's report shows it) and the one `machine: ...` line the terminal
 * benches print first.
 */
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, hostname, loadavg, release, totalmem } from 'node:os';
import { VERSION } from '../src/version.js';
import type { MachineInfo } from './suite-results.js';

const round2 = (x: number) => Math.round(x * 100) / 100;

/** This machine now (loadAverageEnd is 0 until the suite fills it in at the end of its run). */
export function machineInfo(): MachineInfo {
  let ortVersion = 'unknown';
  try {
    ortVersion = (createRequire(import.meta.url)('onnxruntime-node/package.json') as { version: string }).version;
  } catch {
    /* reported as unknown */
  }
  let os = `Linux ${release()}`;
  try {
    const pretty = /PRETTY_NAME="([^"]+)"/.exec(readFileSync('/etc/os-release', 'utf8'));
    if (pretty) os = `${pretty[1]} (kernel ${release()})`;
  } catch {
    /* keep the kernel */
  }
  return {
    host: hostname(),
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    cores: cpus().length,
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    os,
    node: process.version,
    onnxruntime: ortVersion,
    slabserve: VERSION,
    loadAverageStart: round2(loadavg()[0]!),
    loadAverageEnd: 0,
  };
}

/** The `machine: ...` line, with the 1, 5 and 15-minute load averages now (how busy a shared machine is). */
export function machineLine(m: MachineInfo = machineInfo()): string {
  return `machine: ${m.cpu}, ${m.cores} cores, ${m.memoryGiB} GiB, ${m.os}, ${process.platform}-${process.arch}, node ${m.node}, onnxruntime-node ${m.onnxruntime}, loadavg ${loadavg().map(round2).join(' ')}`;
}
