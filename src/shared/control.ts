/**
 * The control block: one small SharedArrayBuffer per process that every
 * thread maps. It holds the doorbells (the inference thread's, one per owner
 * thread), the stop flag, and the inference thread's heartbeat, so that
 * liveness and shutdown need no message round trip.
 */
import { Doorbell } from './doorbell.js';

const I_WORKER_BELL = 0;
const I_STOP = 1;
const I_STATE = 2;
const I_INFLIGHT = 3;
const I_DRAINING = 4;
const I_OWNER_BELLS = 16; // owner bells start on their own cache line
const F_HEARTBEAT = 0;

export const WorkerState = { STARTING: 0, READY: 1, STOPPED: 2, FAILED: 3 } as const;

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

  /** Epoch ms of the inference thread's last loop turn. */
  get heartbeat(): number {
    return this.f64[F_HEARTBEAT]!;
  }

  set heartbeat(v: number) {
    this.f64[F_HEARTBEAT] = v;
  }
}
