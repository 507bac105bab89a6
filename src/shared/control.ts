/**
 * The control block: one small SharedArrayBuffer per process that every
 * thread maps. It holds the doorbells (the inference thread's, one per owner
 * thread), the stop flag, and the inference thread's heartbeat, so that
 * liveness and shutdown need no message round trip.
 *
 * Supervision (src/main/threads/inference-supervisor.ts) adds the epoch: each inference thread
 * is started with the epoch current at its start and stays the live one only
 * while the block still holds it. The main thread bumps the epoch the moment
 * it gives a thread up (crashed, or hung past a timeout), before it answers
 * that thread's requests; a thread that finds its epoch gone touches no slot
 * again. The start of the oldest batch in flight tells a run that hangs from a
 * loop that is merely idle.
 */
import { Doorbell } from './doorbell.js';

const I_WORKER_BELL = 0;
const I_STOP = 1;
const I_STATE = 2;
const I_INFLIGHT = 3;
const I_DRAINING = 4;
const I_EPOCH = 5;
const I_OWNER_BELLS = 16; // owner bells start on their own cache line
const F_HEARTBEAT = 0;
const F_RUN_STARTED = 1;

/**
 * The inference thread's state. RESTARTING: the main thread gave the last one
 * up and a new one is warming up (requests are refused 503 meanwhile).
 */
export const WorkerState = { STARTING: 0, READY: 1, STOPPED: 2, FAILED: 3, RESTARTING: 4 } as const;

export class ControlBlock {
  readonly buffer: SharedArrayBuffer;
  readonly owners: number;
  private readonly i32: Int32Array;
  private readonly f64: Float64Array;
  readonly workerBell: Doorbell;
  private readonly ownerBells: Doorbell[];

  static create(owners: number): ControlBlock {
    if (!Number.isInteger(owners) || owners < 1) throw new RangeError(`owners must be a positive integer, got ${owners}`);
    return new ControlBlock(new SharedArrayBuffer(ControlBlock.byteLength(owners)), owners);
  }

  static byteLength(owners: number): number {
    return 64 + (I_OWNER_BELLS + owners) * 4;
  }

  constructor(buffer: SharedArrayBuffer, owners: number) {
    this.buffer = buffer;
    this.owners = owners;
    this.f64 = new Float64Array(buffer, 0, 8);
    this.i32 = new Int32Array(buffer, 64, I_OWNER_BELLS + owners);
    this.workerBell = new Doorbell(this.i32, I_WORKER_BELL);
    this.ownerBells = Array.from({ length: owners }, (_, i) => new Doorbell(this.i32, I_OWNER_BELLS + i));
  }

  ownerBell(owner: number): Doorbell {
    if (owner < 0 || owner >= this.owners) throw new RangeError(`owner ${owner} out of range 0..${this.owners - 1}`);
    return this.ownerBells[owner]!;
  }

  requestStop(): void {
    Atomics.store(this.i32, I_STOP, 1);
    this.workerBell.ring();
  }

  stopRequested(): boolean {
    return Atomics.load(this.i32, I_STOP) === 1;
  }

  get workerState(): number {
    return Atomics.load(this.i32, I_STATE);
  }

  set workerState(v: number) {
    Atomics.store(this.i32, I_STATE, v);
  }

  /** Set on SIGTERM: readiness turns false and new requests are refused while in-flight ones finish. */
  get draining(): boolean {
    return Atomics.load(this.i32, I_DRAINING) === 1;
  }

  set draining(v: boolean) {
    Atomics.store(this.i32, I_DRAINING, v ? 1 : 0);
  }

  get inflightBatches(): number {
    return Atomics.load(this.i32, I_INFLIGHT);
  }

  set inflightBatches(v: number) {
    Atomics.store(this.i32, I_INFLIGHT, v);
  }

  /** Which inference thread is the live one (see the file comment); 0 for the first. */
  get epoch(): number {
    return Atomics.load(this.i32, I_EPOCH);
  }

  /** Gives the live inference thread up: from now on it touches no slot. Returns the new epoch. */
  nextEpoch(): number {
    return Atomics.add(this.i32, I_EPOCH, 1) + 1;
  }

  /** Epoch ms when the oldest batch now running started; 0 when none runs. */
  get runStartedAt(): number {
    return this.f64[F_RUN_STARTED]!;
  }

  set runStartedAt(v: number) {
    this.f64[F_RUN_STARTED] = v;
  }

  /** Epoch ms of the inference thread's last loop turn. */
  get heartbeat(): number {
    return this.f64[F_HEARTBEAT]!;
  }

  set heartbeat(v: number) {
    this.f64[F_HEARTBEAT] = v;
  }
}
