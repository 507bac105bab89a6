/**
 * onnxruntime's own telemetry: off unless the operator turns it on.
 *
 * onnxruntime 1.29's official Linux and macOS builds carry Microsoft's 1DS
 * telemetry SDK, on by default (onnxruntime's docs/Privacy.md). From a
 * process's first session it keeps a device id and a cache of events
 * (session creations with a hash of the model, the OS, the process's path)
 * in $HOME/.cache/Microsoft/DeveloperTools/.onnxruntime, writes an empty
 * /tmp/mat-debug-<pid>.log per process, and uploads the events to
 * mobile.events.data.microsoft.com. A server on an operator's machine sends
 * nothing anywhere and writes nothing outside its own files unless asked, so
 * slabserve sets onnxruntime's switch, ORT_DISABLE_TELEMETRY=1, before any
 * of its threads opens a session. An operator who wants onnxruntime's
 * telemetry sets ORT_DISABLE_TELEMETRY=0: a value in the environment is kept.
 */
import { isMainThread } from 'node:worker_threads';

/** onnxruntime's switch, read (getenv) as the process's first session starts. */
export const ORT_TELEMETRY_SWITCH = 'ORT_DISABLE_TELEMETRY';

/**
 * Sets ORT_DISABLE_TELEMETRY=1 in the process's environment where it is unset or empty. Only the
 * main thread's process.env is the process's environment: a worker thread's is a copy onnxruntime
 * never reads, so there this does nothing (an engine created in a worker thread needs the variable
 * set for its process). Call it before the first session opens; onnxruntime reads it once.
 */
export function keepOnnxruntimeTelemetryOff(): void {
  if (isMainThread && !process.env[ORT_TELEMETRY_SWITCH]) process.env[ORT_TELEMETRY_SWITCH] = '1';
}
