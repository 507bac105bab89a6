/**
 * The span serializer (src/shared/telemetry/otlp-protobuf.ts) against OpenTelemetry's
 * own (@opentelemetry/otlp-transformer's ProtobufTraceSerializer): the same
 * random spans, both bodies read back field by field by the test's wire
 * reader, must say the same thing. Fields the reference writes with their
 * default value (dropped counts of 0, an UNSET status) are left out of both,
 * as protobuf reads an absent field as its default.
 */
import { TraceFlags, type Attributes, type AttributeValue, type Link } from '@opentelemetry/api';
import { TraceState } from '@opentelemetry/core';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { describe, expect, it } from 'vitest';
import { serializeSpans } from '../src/shared/telemetry/otlp-protobuf.js';
import { SpanRecord, sampledContext, type SpanOrigin } from '../src/shared/telemetry/span-record.js';
import { fields, type Field } from './fixtures/otlp-receiver.js';
import { makeRandom } from './helpers.js';

type Read = string | { [no: string]: Read[] };

/** opentelemetry-proto's messages as far as spans go: which field numbers hold which message. */
const SCHEMA: Record<string, Record<number, string>> = {
  ExportTraceServiceRequest: { 1: 'ResourceSpans' },
  ResourceSpans: { 1: 'Resource', 2: 'ScopeSpans' },
  Resource: { 1: 'KeyValue' },
  ScopeSpans: { 1: 'InstrumentationScope', 2: 'Span' },
  InstrumentationScope: { 3: 'KeyValue' },
  Span: { 9: 'KeyValue', 11: 'Event', 13: 'Link', 15: 'Status' },
  Event: { 3: 'KeyValue' },
  Link: { 4: 'KeyValue' },
  Status: {},
  KeyValue: { 2: 'AnyValue' },
  AnyValue: { 5: 'ArrayValue', 6: 'KeyValueList' },
  ArrayValue: { 1: 'AnyValue' },
  KeyValueList: { 1: 'KeyValue' },
};

/** A message as { field number: its values }, read down the schema; scalars as text; defaults (0, empty, an empty message) left out. */
function decode(buf: Uint8Array, type = 'ExportTraceServiceRequest'): Read {
  const out: Record<string, Read[]> = {};
  for (const f of fields(Buffer.from(buf))) {
    const child = SCHEMA[type]![f.no];
    const value = child ? decode(f.value as Buffer, child) : scalar(f);
    if (value === '' || (typeof value === 'object' && child !== 'AnyValue' && Object.keys(value).length === 0)) continue;
    (out[f.no] ??= []).push(value);
  }
  return out;
}

function scalar(f: Field): string {
  if (Buffer.isBuffer(f.value)) return f.value.toString('hex');
  return f.wire === 0 && f.value === 0n ? '' : f.value.toString();
}

describe('OTLP protobuf of spans', () => {
  it('says what OpenTelemetry\'s own serializer says, for random spans of two resources', () => {
    const rand = makeRandom('otlp protobuf');
    const pick = <T,>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)]!;
    const hex = (n: number) => Array.from({ length: n }, () => Math.floor(rand() * 16).toString(16)).join('');
    const text = (max: number) => Array.from({ length: Math.floor(rand() * max) }, () => pick(['a', 'Z', ' ', '.', 'é', '中', '😀', '\n'])).join('');
    const scalar = (): AttributeValue => pick([() => text(40), () => Math.floor((rand() - 0.5) * 2 ** 40), () => rand() * 1000 - 500, () => rand() < 0.5, () => Math.floor(rand() * 300)])();
    const attributes = (): Attributes => {
      const a: Attributes = {};
      const n = Math.floor(rand() * 8);
      for (let i = 0; i < n; i++) a[`k.${i}.${text(6)}`] = rand() < 0.15 ? [scalar(), scalar()].map(String) : rand() < 0.1 ? text(300) : scalar();
      return a;
    };
    const origins: SpanOrigin[] = [
      { resource: resourceFromAttributes({ 'service.name': 'slabserve', 'host.name': text(20) }), scope: { name: 'slabserve' } },
      { resource: resourceFromAttributes({ 'service.name': text(10) }), scope: { name: 'other', version: '1.2.3' } },
    ];
    const spans: SpanRecord[] = [];
    for (let i = 0; i < 300; i++) {
      const state = rand() < 0.2 ? new TraceState(`vendor=${hex(8)},other=x`) : undefined;
      const ctx = sampledContext(hex(32), hex(16), state);
      const parent = rand() < 0.7 ? sampledContext(ctx.traceId, hex(16), undefined, rand() < 0.5) : undefined;
      // many links now and then: a span longer than 2^14 bytes, its length in three bytes
      const links: Link[] = Array.from({ length: rand() < 0.05 ? 400 : Math.floor(rand() * 4) }, () => ({
        context: sampledContext(hex(32), hex(16), undefined, rand() < 0.5),
        ...(rand() < 0.3 ? { attributes: attributes() } : {}),
      }));
      const start = 1.7e12 + rand() * 1e11;
      const status = pick([undefined, { code: 2, message: text(30) }, { code: 1 }]);
      spans.push(new SpanRecord(pick(origins), text(30) || 'x', pick([0, 1, 2, 3, 4]), ctx, parent, start, start + rand() * 100, attributes(), links, status));
    }
    const ours = decode(serializeSpans(spans));
    const reference = decode(ProtobufTraceSerializer.serializeRequest(spans)!);
    expect(ours).toEqual(reference);
    // and it holds what was put in: 300 spans, in two resources
    const resourceSpans = (ours as Record<string, Read[]>)['1']!;
    expect(resourceSpans).toHaveLength(2);
  });

  it('writes times as exact nanoseconds above 2^53, from an HrTime or from epoch ms', () => {
    const origin: SpanOrigin = { resource: resourceFromAttributes({}), scope: { name: 's' } };
    const ctx = sampledContext('ab'.repeat(16), 'cd'.repeat(8));
    const startOf = (body: Uint8Array) => {
      const resourceSpans = fields(Buffer.from(body))[0]!.value as Buffer;
      const scopeSpans = fields(resourceSpans).find((f) => f.no === 2)!.value as Buffer;
      const span = fields(scopeSpans).find((f) => f.no === 2)!.value as Buffer;
      return fields(span).find((f) => f.no === 7)!.value;
    };
    // HrTimes another span could carry: a second's last nanosecond, a date far ahead, the epoch
    for (const [s, ns] of [[1764800000, 999999999], [4102444800, 1], [0, 0]] as const) {
      const plain = { name: 'x', droppedAttributesCount: 0, droppedEventsCount: 0, droppedLinksCount: 0, kind: 0, spanContext: () => ctx, startTime: [s, ns], endTime: [s, ns], attributes: {}, links: [], events: [], status: { code: 0 }, resource: origin.resource, instrumentationScope: origin.scope };
      expect(startOf(serializeSpans([plain as never]))).toBe(BigInt(s) * 1_000_000_000n + BigInt(ns));
    }
    // a SpanRecord's epoch ms: whole ms, and a fraction kept to the nanosecond
    for (const ms of [1764800000123, 1764800000123.5, 4102444800000.25]) {
      const expected = BigInt(Math.trunc(ms)) * 1_000_000n + BigInt(Math.round((ms % 1) * 1e6));
      expect(startOf(serializeSpans([new SpanRecord(origin, 'x', 0, ctx, undefined, ms, ms)]))).toBe(expected);
    }
  });
});
