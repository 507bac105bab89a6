/** The floor case's records and table (bench/suite/floor.ts runs it): what the report needs. */
import { median } from './suite/phases.js';

/** What is sent: texts, or their token ids. */
type Form = 'text' | 'ids';

export type Side = 'slabserve' | 'floor';

export interface FloorPhase {
  side: Side;
  transport: 'http' | 'ws';
  form: Form;
  clients: number;
  round: number;
  requests: number;
  reqPerS: number;
  p50Ms: number;
  p99Ms: number;
  errors: number;
  /** CPU microseconds per answered request, by thread name. */
  cpuUsPerRequest: Record<string, number>;
  /** The load generator's own CPU per request (this process). */
  clientUsPerRequest: number;
}

export interface FloorRow {
  transport: 'http' | 'ws';
  form: Form;
  clients: number;
  /** Medians over rounds. */
  slabserve: { reqPerS: number; p50Ms: number; cpu: Record<string, number> };
  floor: { reqPerS: number; p50Ms: number; cpu: Record<string, number> };
  /** slabserve's gateway thread CPU per request over the floor's main thread's. */
  gatewayOverFloor: number;
}

/** slabserve's CPU per request on all its gateway threads together (gateway-0, gateway-1, ...). */
export function gatewayUs(cpu: Record<string, number>): number {
  let sum = 0;
  for (const [thread, us] of Object.entries(cpu)) if (thread.startsWith('gateway')) sum += us;
  return sum;
}

/** One row per (transport, form, clients): the median round of each side. */
export function floorRows(phases: FloorPhase[]): FloorRow[] {
  const rows: FloorRow[] = [];
  const keys = new Set(phases.map((p) => `${p.transport}|${p.form}|${p.clients}`));
  for (const key of keys) {
    const [transport, form, clients] = key.split('|') as ['http' | 'ws', Form, string];
    const side = (s: Side) => {
      const ps = phases.filter((p) => p.side === s && `${p.transport}|${p.form}|${p.clients}` === key);
      const names = new Set(ps.flatMap((p) => Object.keys(p.cpuUsPerRequest)));
      const cpu: Record<string, number> = {};
      for (const n of names) cpu[n] = median(ps.map((p) => p.cpuUsPerRequest[n] ?? 0));
      return { reqPerS: median(ps.map((p) => p.reqPerS)), p50Ms: median(ps.map((p) => p.p50Ms)), cpu };
    };
    const slabserve = side('slabserve');
    const floor = side('floor');
    const gatewayOverFloor = Math.round((gatewayUs(slabserve.cpu) / (floor.cpu.main ?? NaN)) * 100) / 100;
    rows.push({ transport, form, clients: Number(clients), slabserve, floor, gatewayOverFloor });
  }
  return rows;
}

/** The floor table (Markdown). */
export function floorTable(rows: FloorRow[]): string {
  const head = [
    'transport',
    'input',
    'clients',
    'slabserve req/s',
    'floor req/s',
    'gateway us/req',
    'floor us/req',
    'gateway / floor',
    'inference us/req',
    'onnxruntime us/req',
    'main us/req',
    'other us/req (slabserve / floor)',
    'P50 ms (slabserve / floor)',
  ];
  const f = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? '-' : String(Math.round(v)));
  const lines = rows.map((r) => {
    return [
      r.transport,
      r.form,
      String(r.clients),
      f(r.slabserve.reqPerS),
      f(r.floor.reqPerS),
      f(gatewayUs(r.slabserve.cpu)),
      f(r.floor.cpu.main),
      `${r.gatewayOverFloor.toFixed(2)}x`,
      f(r.slabserve.cpu.inference),
      f(r.slabserve.cpu.onnxruntime),
      f(r.slabserve.cpu.main),
      `${f(r.slabserve.cpu.other)} / ${f(r.floor.cpu.other)}`,
      `${r.slabserve.p50Ms.toFixed(2)} / ${r.floor.p50Ms.toFixed(2)}`,
    ];
  });
  return [`| ${head.join(' | ')} |`, `|${head.map((_, i) => (i < 3 ? '---' : '---:')).join('|')}|`, ...lines.map((l) => `| ${l.join(' | ')} |`)].join('\n');
}

