/**
 * The OTLP protobuf serializer: slabserve's (src/shared/telemetry/otlp-protobuf.ts)
 * against OpenTelemetry's own (@opentelemetry/otlp-transformer's ProtobufTraceSerializer),
 * each inside the whole traced path of a sampled request (micro/tracing-path.ts: its spans
 * made, carried through a slot and serialized as the exporter sends them), in alternating
 * rounds: CPU per sampled request and bytes per request. First, the same exported spans
 * through both, compared: how many bodies have the same length, and how many the same bytes.
 *
 *   node dist/bench/micro/otlp-serializer.js [--rounds 6] [--requests 40000]
 */
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { parseOptions } from '../args.js';
import { machineLine } from '../machine.js';
import { median, roundOrder } from '../suite/phases.js';
import { serializeSpans } from '../../src/shared/telemetry/otlp-protobuf.js';
import { measureTracedPath, type SpanSerializer, type TracedPathCost } from './tracing-path.js';

const opts = parseOptions('node dist/bench/micro/otlp-serializer.js [options]', {
  rounds: { type: 'int', min: 1, default: 6, help: 'rounds, the sides alternating' },
  requests: { type: 'int', min: 1000, default: 40_000, help: 'sampled requests per side per round' },
});

const otel: SpanSerializer = (spans) => ProtobufTraceSerializer.serializeRequest(spans as never)!;
const sides: [string, SpanSerializer][] = [
  ['slabserve', serializeSpans],
  ['opentelemetry', otel],
];

/** The same spans through both serializers: what each body holds. */
async function sameBodies(): Promise<string> {
  const caught: Parameters<SpanSerializer>[0][] = [];
  await measureTracedPath(512, (spans) => {
    caught.push(spans);
    return serializeSpans(spans);
  });
  let same = 0;
  let lengths = 0;
  for (const spans of caught) {
    const a = serializeSpans(spans);
    const b = otel(spans);
    if (a.length === b.length) lengths++;
    if (a.length === b.length && a.every((x, i) => x === b[i])) same++;
  }
  return `${caught.length} exported bodies: ${lengths} of the same length, ${same} byte for byte the same`;
}


console.log(machineLine());
console.log(await sameBodies());
const results = new Map<string, TracedPathCost[]>(sides.map(([name]) => [name, []]));
for (let round = 0; round < opts.rounds; round++) {
  for (const i of roundOrder(round + 1, sides.length)) {
    const [name, serialize] = sides[i]!;
    const r = await measureTracedPath(opts.requests, serialize);
    results.get(name)!.push(r);
    console.log(`round ${round + 1} ${name}: ${r.cpuUs.toFixed(2)} µs CPU per sampled request, ${r.bytesPerRequest.toFixed(0)} bytes`);
  }
}
const ours = results.get('slabserve')!.map((r) => r.cpuUs);
const theirs = results.get('opentelemetry')!.map((r) => r.cpuUs);
const ratios = ours.map((x, i) => theirs[i]! / x);
console.log(`median CPU per sampled request: slabserve ${median(ours).toFixed(2)} µs, opentelemetry ${median(theirs).toFixed(2)} µs; opentelemetry / slabserve by round: ${ratios.map((x) => x.toFixed(2)).join(', ')}`);
