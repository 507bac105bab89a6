/**
 * Spans to an OTLP ExportTraceServiceRequest in protobuf, one pass into one
 * buffer (opentelemetry/proto trace/v1/trace.proto; field numbers in the
 * comments). The OTLP/HTTP exporter of @opentelemetry/otlp-exporter-base
 * sends what this returns, with its retries, timeouts and headers (tracing.ts).
 *
 * Why not @opentelemetry/otlp-transformer's serializer, which this mirrors
 * field for field: it turns every trace and span id from hex into a fresh
 * Uint8Array, twice (a sizing pass, then the write), which would be the largest
 * single cost of a traced request's CPU (docs/tracing.md, What it costs). Here
 * the hex digits are written straight into the output, and each message's
 * length is written after it (moved up when it takes more than one byte).
 */
import type { Attributes, AttributeValue, HrTime, Link, SpanContext } from '@opentelemetry/api';
import type { ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { SpanRecord } from './span-record.js';

const LEN = 2;
const VARINT = 0;
const I64 = 1;
const I32 = 5;
/** Span.flags: the W3C flags, and whether the parent was remote (OTLP 1.x's two bits). */
const HAS_IS_REMOTE = 0x100;
const IS_REMOTE = 0x200;

/** The request body for `spans`, grouped by resource and scope as OTLP nests them. */
export function serializeSpans(spans: readonly ReadableSpan[]): Uint8Array {
  const w = new Writer(256 + spans.length * 320);
  for (const [resource, byScope] of group(spans)) {
    w.tag(1, LEN); // ExportTraceServiceRequest.resource_spans
    const resourceSpans = w.fork();
    w.tag(1, LEN); // ResourceSpans.resource
    const res = w.fork();
    writeAttributes(w, resource.attributes, 1); // Resource.attributes
    w.close(res);
    for (const scoped of byScope.values()) {
      w.tag(2, LEN); // ResourceSpans.scope_spans
      const scopeSpans = w.fork();
      const scope = scoped[0]!.instrumentationScope;
      w.tag(1, LEN); // ScopeSpans.scope
      const s = w.fork();
      w.stringField(1, scope.name);
      if (scope.version) w.stringField(2, scope.version);
      w.close(s);
      for (const span of scoped) writeSpan(w, span);
      if (scope.schemaUrl) w.stringField(3, scope.schemaUrl);
      w.close(scopeSpans);
    }
    w.close(resourceSpans);
  }
  return w.finish();
}

function group(spans: readonly ReadableSpan[]): Map<ReadableSpan['resource'], Map<ReadableSpan['instrumentationScope'], ReadableSpan[]>> {
  const out = new Map<ReadableSpan['resource'], Map<ReadableSpan['instrumentationScope'], ReadableSpan[]>>();
  for (const span of spans) {
    let byScope = out.get(span.resource);
    if (!byScope) out.set(span.resource, (byScope = new Map()));
    const list = byScope.get(span.instrumentationScope);
    if (list) list.push(span);
    else byScope.set(span.instrumentationScope, [span]);
  }
  return out;
}

function writeSpan(w: Writer, span: ReadableSpan): void {
  w.tag(2, LEN); // ScopeSpans.spans
  const at = w.fork();
  const ctx = span.spanContext();
  w.hexField(1, ctx.traceId); // trace_id
  w.hexField(2, ctx.spanId); // span_id
  const state = ctx.traceState?.serialize();
  if (state) w.stringField(3, state); // trace_state
  const parent = span.parentSpanContext;
  if (parent) w.hexField(4, parent.spanId); // parent_span_id
  w.stringField(5, span.name);
  w.tag(6, VARINT); // kind: OTLP counts from SPAN_KIND_UNSPECIFIED = 0, the API from INTERNAL = 0
  w.varint(span.kind + 1);
  w.tag(7, I64); // start_time_unix_nano
  if (span instanceof SpanRecord) w.epochMs(span.startMs);
  else w.nanos(span.startTime);
  w.tag(8, I64); // end_time_unix_nano
  if (span instanceof SpanRecord) w.epochMs(span.endMs);
  else w.nanos(span.endTime);
  writeAttributes(w, span.attributes, 9);
  for (const e of span.events) {
    w.tag(11, LEN); // events
    const ev = w.fork();
    w.tag(1, I64);
    w.nanos(e.time);
    w.stringField(2, e.name);
    if (e.attributes) writeAttributes(w, e.attributes, 3);
    w.close(ev);
  }
  for (const link of span.links) writeLink(w, link);
  if (span.status.code !== 0 || span.status.message) {
    w.tag(15, LEN); // status
    const st = w.fork();
    if (span.status.message) w.stringField(2, span.status.message);
    w.tag(3, VARINT);
    w.varint(span.status.code);
    w.close(st);
  }
  w.tag(16, I32); // flags
  w.fixed32(flagsOf(ctx, parent));
  w.close(at);
}

function writeLink(w: Writer, link: Link): void {
  w.tag(13, LEN); // Span.links
  const at = w.fork();
  w.hexField(1, link.context.traceId);
  w.hexField(2, link.context.spanId);
  const state = link.context.traceState?.serialize();
  if (state) w.stringField(3, state);
  if (link.attributes) writeAttributes(w, link.attributes, 4);
  w.tag(6, I32);
  w.fixed32(flagsOf(link.context, link.context));
  w.close(at);
}

function flagsOf(ctx: SpanContext, parent: SpanContext | undefined): number {
  return (ctx.traceFlags & 0xff) | HAS_IS_REMOTE | (parent?.isRemote ? IS_REMOTE : 0);
}

/** KeyValue messages in field `field`: strings, booleans, numbers (int64 when whole), and arrays of them. */
function writeAttributes(w: Writer, attributes: Attributes, field: number): void {
  for (const key in attributes) {
    const value = attributes[key];
    if (value === undefined || value === null) continue;
    w.tag(field, LEN);
    const kv = w.fork();
    w.stringField(1, key);
    w.tag(2, LEN); // KeyValue.value
    const v = w.fork();
    writeValue(w, value);
    w.close(v);
    w.close(kv);
  }
}

/** AnyValue's fields: string_value 1, bool_value 2, int_value 3, double_value 4, array_value 5. */
function writeValue(w: Writer, value: AttributeValue | null | undefined): void {
  if (typeof value === 'string') w.stringField(1, value);
  else if (typeof value === 'boolean') {
    w.tag(2, VARINT);
    w.varint(value ? 1 : 0);
  } else if (typeof value === 'number') {
    if (Number.isSafeInteger(value)) {
      w.tag(3, VARINT);
      w.int64(value);
    } else {
      w.tag(4, I64);
      w.double(value);
    }
  } else if (Array.isArray(value)) {
    w.tag(5, LEN);
    const array = w.fork();
    for (const item of value) {
      w.tag(1, LEN); // ArrayValue.values
      const v = w.fork();
      if (item !== null && item !== undefined) writeValue(w, item);
      w.close(v);
    }
    w.close(array);
  }
}

/** A hex digit's value by its char code (what is not a digit reads as 0). */
const HEX = new Uint8Array(128);
for (let i = 0; i < 16; i++) {
  HEX['0123456789abcdef'.charCodeAt(i)] = i;
  HEX['0123456789ABCDEF'.charCodeAt(i)] = i;
}

/** A protobuf writer into one growing buffer: a message's length is written when it closes. */
class Writer {
  private buf: Buffer;
  private pos = 0;

  constructor(size: number) {
    this.buf = Buffer.allocUnsafe(size);
  }

  finish(): Uint8Array {
    return this.buf.subarray(0, this.pos);
  }

  tag(field: number, wire: number): void {
    this.varint((field << 3) | wire);
  }

  /** A non-negative integer below 2^53. */
  varint(v: number): void {
    this.room(8);
    const b = this.buf;
    while (v > 0x7f) {
      b[this.pos++] = (v & 0x7f) | 0x80;
      v = Math.floor(v / 128);
    }
    b[this.pos++] = v;
  }

  /** A safe integer as int64 (a negative one in ten bytes, two's complement). */
  int64(v: number): void {
    if (v >= 0) return this.varint(v);
    let x = BigInt.asUintN(64, BigInt(v));
    this.room(10);
    while (x > 0x7fn) {
      this.buf[this.pos++] = Number(x & 0x7fn) | 0x80;
      x >>= 7n;
    }
    this.buf[this.pos++] = Number(x);
  }

  fixed32(v: number): void {
    this.room(4);
    this.pos = this.buf.writeUInt32LE(v >>> 0, this.pos);
  }

  double(v: number): void {
    this.room(8);
    this.pos = this.buf.writeDoubleLE(v, this.pos);
  }

  /** Epoch ms (a fraction of a ms kept to the ns) as fixed64 nanoseconds: as `nanos`, without an HrTime made for it. */
  epochMs(ms: number): void {
    let seconds = Math.trunc(ms / 1000);
    let ns = Math.round((ms % 1000) * 1e6); // as the SDK's millisToHrTime
    if (ns >= 1e9) {
      seconds++;
      ns -= 1e9;
    }
    this.nanos([seconds, ns]);
  }

  /** An HrTime as fixed64 nanoseconds since the epoch (above 2^53: written as two exact 32-bit halves). */
  nanos([seconds, ns]: HrTime): void {
    // seconds * 1e9 = seconds * 1953125 * 2^9, and seconds * 1953125 is below 2^53
    const a = seconds * 1953125;
    const high = Math.floor(a / 2 ** 23);
    const low = (a - high * 2 ** 23) * 512 + ns;
    const carry = Math.floor(low / 2 ** 32);
    this.fixed32(low - carry * 2 ** 32);
    this.fixed32(high + carry);
  }

  stringField(field: number, s: string): void {
    this.tag(field, LEN);
    if (s.length < 0x80 && this.ascii(s)) return;
    const bytes = Buffer.byteLength(s);
    this.varint(bytes);
    this.room(bytes);
    this.pos += this.buf.write(s, this.pos, 'utf8');
  }

  /** A short string's length and bytes when it is ASCII (names, keys, ids: most strings here), copied by hand: a native call costs more. */
  private ascii(s: string): boolean {
    this.room(s.length + 1);
    const b = this.buf;
    const start = this.pos + 1;
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c >= 0x80) return false;
      b[start + i] = c;
    }
    b[this.pos] = s.length;
    this.pos = start + s.length;
    return true;
  }

  /** `hex` (an id: 16 or 32 digits, as the API validates them) as bytes; by hand, as a native call costs more than the loop. */
  hexField(field: number, hex: string): void {
    const n = hex.length >> 1;
    this.tag(field, LEN);
    this.varint(n);
    this.room(n);
    const b = this.buf;
    let p = this.pos;
    for (let i = 0; i < 2 * n; i += 2) b[p++] = (HEX[hex.charCodeAt(i) & 0x7f]! << 4) | HEX[hex.charCodeAt(i + 1) & 0x7f]!;
    this.pos = p;
  }

  /** Starts a length-delimited message: one byte kept for its length. */
  fork(): number {
    this.room(1);
    return this.pos++;
  }

  /** Ends the message `fork` started: its length written, the message moved up when the length takes more than one byte. */
  close(at: number): void {
    const length = this.pos - at - 1;
    if (length < 0x80) {
      this.buf[at] = length;
      return;
    }
    const extra = (length < 1 << 14 ? 2 : length < 1 << 21 ? 3 : length < 1 << 28 ? 4 : 5) - 1;
    this.room(extra);
    const b = this.buf;
    b.copyWithin(at + 1 + extra, at + 1, this.pos);
    this.pos += extra;
    let v = length;
    for (let i = 0; i < extra; i++, v >>>= 7) b[at + i] = (v & 0x7f) | 0x80;
    b[at + extra] = v;
  }

  private room(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const bigger = Buffer.allocUnsafe(Math.max(this.buf.length * 2, this.pos + n));
    this.buf.copy(bigger, 0, 0, this.pos);
    this.buf = bigger;
  }
}
