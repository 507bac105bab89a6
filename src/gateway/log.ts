/**
 * Structured logs (pino): one JSON object a line, `{level, time, pid, thread,
 * msg, ...}`. Every thread makes its own loggers over one of these outputs:
 *
 *   fd / stream  written synchronously to a file descriptor, from any thread, by
 *                pino's SonicBoom (a full pipe is waited out); a gateway's access
 *                lines are gathered over one event-loop turn and written together
 *                (turnBatchedFd: whole lines, at most 4 KiB a write, so lines of
 *                different threads never interleave), and flushed before the
 *                thread closes or dies
 *   write        each line handed to a function (the server's `log` hook; a gateway
 *                thread posts its lines to the main thread in batches, once per
 *                turn of its event loop, and before it closes)
 *
 * Two kinds of lines, as nginx has an error log and an access log: events
 * (start-up, readiness, drain, warnings), and one access line per request
 * (`msg: "request"`) at `info`, or `error` for an internal error (with its
 * message, which the client never sees). The CLI writes events to stderr and
 * access lines to stdout (each gateway thread straight to fd 1); with a `log`
 * hook and no file descriptor, both reach the hook. Request bodies, headers
 * and keys are never logged.
 *
 * A file descriptor's lines are JSON unless a person reads them: --log-format
 * auto (the default) turns them into readable lines where the descriptor is a
 * terminal, by pino's own printer (pino-pretty), loaded only then.
 */
import { createRequire } from 'node:module';
import { isatty } from 'node:tty';
import pino, { type DestinationStream, type Logger } from 'pino';
import type { LogFormat, LogLevel } from '../shared/options.js';


export type LogOutput = { fd: number } | { stream: DestinationStream } | { write: (line: string) => void };

export type { DestinationStream, Logger };

/** How lines to a file descriptor are written: JSON, readable (pretty), or readable where it is a terminal (auto). */

/** Whether lines to `fd` are written readable under `format`. */
export function readableOn(format: LogFormat, fd: number): boolean {
  return format === 'pretty' || (format === 'auto' && isatty(fd));
}

/** A JSON log line as a readable one ("[13:24:01.092] INFO: (main) slabserve: ready at ..."), coloured where `colors`; other text as it is. */
export function readableLine(colors: boolean): (line: string) => string {
  const { prettyFactory } = createRequire(import.meta.url)('pino-pretty') as typeof import('pino-pretty');
  const pretty = prettyFactory({ colorize: colors, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname,thread', messageFormat: '({thread}) {msg}', singleLine: true });
  return (line) => pretty(line);
}

/**
 * Synchronous writes to `fd` (pino's SonicBoom: a full pipe is waited out, never an error), each
 * line readable where `format` says so.
 */
export function logDestination(fd: number, format: LogFormat = 'json'): DestinationStream {
  const dest = pino.destination({ dest: fd, sync: true });
  if (!readableOn(format, fd)) return dest;
  const readable = readableLine(isatty(fd));
  return { write: (line: string) => dest.write(readable(line)) };
}

/** A JSON logger at `level` over `out`; `thread` names the thread on every line. */
export function createLogger(level: LogLevel, thread: string, out: LogOutput): Logger {
  const stream: DestinationStream =
    'fd' in out
      ? logDestination(out.fd)
      : 'stream' in out
        ? out.stream
        : { write: (s: string) => out.write(s.charCodeAt(s.length - 1) === 10 ? s.slice(0, -1) : s) };
  return pino(
    {
      level,
      base: { pid: process.pid, thread },
      timestamp: pino.stdTimeFunctions.isoTime,
      formatters: { level: (label) => ({ level: label }) },
    },
    stream,
  );
}

/** Bytes a pipe writes in one piece even when other threads write to it too (Linux PIPE_BUF). */
const PIPE_BUF = 4096;

/**
 * Lines for `fd`, gathered over one turn of the event loop and written
 * together, synchronously, in writes of whole lines of at most 4 KiB (a pipe
 * keeps each in one piece among other threads' writes): under load one
 * write(2) carries many lines. flush() writes what is gathered at once
 * (before the thread closes or dies); nothing waits longer than one turn.
 */
export function turnBatchedFd(fd: number, format: LogFormat = 'json'): { stream: DestinationStream; flush: () => void } {
  const dest = logDestination(fd);
  const readable = readableOn(format, fd) ? readableLine(isatty(fd)) : null;
  const batched = batchedLines((out) => {
    let chunk = '';
    let bytes = 0;
    for (const json of out) {
      const line = readable ? readable(json) : json;
      const n = Buffer.byteLength(line);
      if (bytes > 0 && bytes + n > PIPE_BUF) {
        dest.write(chunk);
        chunk = '';
        bytes = 0;
      }
      chunk += line;
      bytes += n;
    }
    if (bytes > 0) dest.write(chunk);
  });
  return { stream: { write: batched.write }, flush: batched.flush };
}

/**
 * Lines batched for a `post` (a worker's port): flushed once per event-loop
 * turn that produced any, and by flush() (before the thread closes).
 */
export function batchedLines(post: (lines: string[]) => void): { write: (line: string) => void; flush: () => void } {
  let lines: string[] = [];
  let scheduled = false;
  const flush = () => {
    scheduled = false;
    if (lines.length === 0) return;
    const out = lines;
    lines = [];
    post(out);
  };
  return {
    write: (line) => {
      lines.push(line);
      if (!scheduled) {
        scheduled = true;
        setImmediate(flush);
      }
    },
    flush,
  };
}

/** One finished request, as the access log records it. */
export interface AccessEntry {
  reqId: string;
  method: string;
  route: string;
  path: string;
  model: string;
  status: number;
  ms: number;
  /** Our error code, on failure. */
  code?: string;
  /** An internal error's message (never sent to the client). */
  error?: string;
  /** WebSocket: the client's request id. */
  wsId?: string | number;
  /** A health probe or metrics scrape: no line unless the log takes probes (--log-probes). */
  probe?: boolean;
}

/** Printable ASCII without `"` and `\\`: such a string is its own JSON text (request ids, routes, model names, codes, most paths). */
const JSON_SAFE = /^[\x20\x21\x23-\x5b\x5d-\x7e]*$/;

/** `s` as the inside of a JSON string literal. */
function jsonText(s: string): string {
  return JSON_SAFE.test(s) ? s : JSON.stringify(s).slice(1, -1);
}

/** pino's numeric levels (a line is written when its level is at least the logger's). */
const LEVEL_VALUE: Record<LogLevel, number> = { fatal: 60, error: 50, warn: 40, info: 30, debug: 20, trace: 10, silent: Infinity };

/**
 * The access log of one thread: one line per finished request, in the same
 * JSON shape as pino's lines (level, time, pid, thread, the fields, msg), but
 * formatted here in one template: pino's object serialisation and its time
 * function are a visible share of a gateway thread's CPU under load.
 */
export class AccessLog {
  /** Whether access lines are written at all (checked before building one). */
  readonly enabled: boolean;
  private readonly errorsEnabled: boolean;
  /** Whether health probes and metrics scrapes get lines too: one every few seconds per prober, which drowns the requests. */
  private readonly probes: boolean;
  private readonly out: DestinationStream;
  /** `"pid":N,"thread":"gateway-0"`, formatted once. */
  private readonly base: string;
  /** The ISO time of the last line's millisecond: lines of one millisecond share it (toISOString is much of a line's cost). */
  private isoMs = 0;
  private iso = '';

  constructor(level: LogLevel, thread: string, out: DestinationStream, probes = false) {
    this.enabled = LEVEL_VALUE[level] <= LEVEL_VALUE.info;
    this.errorsEnabled = LEVEL_VALUE[level] <= LEVEL_VALUE.error;
    this.probes = probes;
    this.out = out;
    this.base = `"pid":${process.pid},"thread":${JSON.stringify(thread)}`;
  }

  record(e: AccessEntry): void {
    const internal = e.error !== undefined;
    if (internal ? !this.errorsEnabled : !this.enabled || (e.probe === true && !this.probes)) return;
    const path = e.path.length > 256 ? `${e.path.slice(0, 256)}...` : e.path;
    const now = Date.now();
    if (now !== this.isoMs) {
      this.isoMs = now;
      this.iso = new Date(now).toISOString();
    }
    let line =
      `{"level":"${internal ? 'error' : 'info'}","time":"${this.iso}",${this.base},` +
      `"req_id":"${jsonText(e.reqId)}","method":"${jsonText(e.method)}","route":"${jsonText(e.route)}","path":"${jsonText(path)}",` +
      `"model":"${jsonText(e.model)}","status":${e.status},"duration_ms":${Math.round(e.ms * 1000) / 1000}`;
    if (e.wsId !== undefined) line += `,"ws_id":${JSON.stringify(typeof e.wsId === 'string' && e.wsId.length > 128 ? `${e.wsId.slice(0, 128)}...` : e.wsId)}`;
    if (e.code !== undefined) line += `,"code":"${jsonText(e.code)}"`;
    if (internal) line += `,"error":${JSON.stringify(e.error)}`;
    this.out.write(`${line},"msg":"request"}\n`);
  }
}
