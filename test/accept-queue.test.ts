/**
 * src/main/drain/accept-queue.ts and src/main/drain/kernel-sockets.ts: the drain's wait for the
 * kernel's accept queues, first against a fake kernel (the policy), then on
 * real sockets (the kernel calls). The real listen socket lives in a worker
 * thread that the test parks in Atomics.wait, so connections stay in the
 * kernel's accept queue for as long as the test needs: as a gateway's do while
 * it is busy. Closing it then resets them (the control case, the failure the
 * drain had); quieting it first answers every one of them.
 */
import net from 'node:net';
import { createRequire } from 'node:module';
import { Worker } from 'node:worker_threads';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { HARDWARE } from './fixtures/skips.js';
import { quietListenSockets } from '../dist/src/main/drain/accept-queue.js';
import { linuxSockets, type KernelSockets } from '../dist/src/main/drain/kernel-sockets.js';
import { eventually } from './helpers.js';

/** A kernel whose queues shrink by one per read: `queued` accepted, then `halfOpen` handshakes completed (and accepted). */
function fakeKernel(fds: number[], queued: number, halfOpen: number): KernelSockets & { filtered: number[]; reads: number } {
  const k = {
    filtered: [] as number[],
    reads: 0,
    listenSockets: () => fds,
    dropNewConnections: (fd: number) => void k.filtered.push(fd),
    acceptQueueLength: (fd: number) => {
      k.reads++;
      if (fd !== fds[0]) return 0;
      return queued > 0 ? queued-- : 0;
    },
    halfOpen: () => (halfOpen > 0 ? halfOpen-- : 0),
  };
  return k;
}

describe('quietListenSockets, against a fake kernel', () => {
  it('filters every listen socket, then waits until the accept queues and the half-open handshakes are empty', async () => {
    const kernel = fakeKernel([7, 9], 3, 2);
    const out = await quietListenSockets(4000, { timeoutMs: 5000, pollMs: 1 }, kernel);
    expect(kernel.filtered).toEqual([7, 9]);
    expect(out).toMatchObject({ sockets: 2, filtered: true, left: 0 });
    expect(out.why).toBeUndefined();
    expect(kernel.reads).toBe(2 * (3 + 2 + 1)); // both queues read on every pass until both counts reached 0
  });

  it('gives up after timeoutMs and says how many are still waiting', async () => {
    const kernel = { ...fakeKernel([7], 0, 0), acceptQueueLength: () => 2 };
    const out = await quietListenSockets(4000, { timeoutMs: 30, pollMs: 1 }, kernel);
    expect(out).toMatchObject({ sockets: 1, filtered: true, left: 2, why: `2 connection(s) still waiting after ${out.waitedMs} ms` });
  });

  it('says why when it cannot help: no listen socket, no kernel calls, a call that fails', async () => {
    expect(await quietListenSockets(4000, { timeoutMs: 100 }, fakeKernel([], 0, 0))).toEqual({
      sockets: 0,
      filtered: false,
      waitedMs: 0,
      left: 0,
      why: 'this process has no listen socket on port 4000',
    });
    expect((await quietListenSockets(4000, { timeoutMs: 100 }, new Error('koffi did not load: x'))).why).toBe('koffi did not load: x');
    const failing = {
      ...fakeKernel([7], 0, 0),
      dropNewConnections: () => {
        throw new Error('setsockopt(SO_ATTACH_FILTER) on fd 7: errno 9');
      },
    };
    expect(await quietListenSockets(4000, { timeoutMs: 100 }, failing)).toMatchObject({ filtered: false, why: 'setsockopt(SO_ATTACH_FILTER) on fd 7: errno 9' });
  });
});

/**
 * A net.Server in a worker thread answering "pong" to each connection's first
 * data. gate[1] = 1 once it is parked; gate[0] = 1 lets it go on, 2 makes it
 * close its listen socket the moment it wakes, before it accepts anything.
 */
const LISTENER = `
const { parentPort, workerData } = require('node:worker_threads');
const net = require('node:net');
const gate = new Int32Array(workerData.gate);
const server = net.createServer((s) => s.once('data', () => s.end('pong')));
server.listen(0, '127.0.0.1', () => parentPort.postMessage({ port: server.address().port, fd: server._handle.fd }));
parentPort.on('message', (m) => {
  if (m === 'park') {
    Atomics.store(gate, 1, 1);
    Atomics.wait(gate, 0, 0);
    if (Atomics.load(gate, 0) === 2) server.close();
  } else if (m === 'close') server.close(() => parentPort.postMessage('closed'));
});`;

interface Listener {
  port: number;
  fd: number;
  worker: Worker;
  /** Parks the thread: from now on nothing is accepted. */
  park(): Promise<void>;
  /** Wakes it: it accepts (1) or closes at once (2). */
  wake(how: 1 | 2): void;
  close(): Promise<void>;
}

async function startListener(): Promise<Listener> {
  const gate = new Int32Array(new SharedArrayBuffer(8));
  const worker = new Worker(LISTENER, { eval: true, workerData: { gate: gate.buffer } });
  const { port, fd } = await new Promise<{ port: number; fd: number }>((r) => worker.once('message', r));
  return {
    port,
    fd,
    worker,
    park: async () => {
      worker.postMessage('park');
      await eventually('the listener parked', async () => Atomics.load(gate, 1), (v) => v === 1, 5000);
    },
    wake: (how) => {
      Atomics.store(gate, 0, how);
      Atomics.notify(gate, 0);
    },
    close: async () => {
      worker.postMessage('close');
      await new Promise((r) => worker.once('message', r));
    },
  };
}

/** A client that connects and sends "ping": what it read, or its error code; `connected` once the handshake completed. */
function ping(port: number): { socket: net.Socket; connected: Promise<void>; result: Promise<string> } {
  const socket = net.connect({ port, host: '127.0.0.1' });
  const connected = new Promise<void>((r) => socket.once('connect', () => r()));
  const result = new Promise<string>((resolve) => {
    let read = '';
    socket.on('connect', () => socket.write('ping'));
    socket.on('data', (d) => (read += d));
    socket.on('end', () => resolve(read));
    socket.on('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
  });
  return { socket, connected, result };
}

const TCP_SYN_SENT = 2;

/**
 * A client socket's state and how often it resent its last segment, from its
 * own TCP_INFO (tcpi_state and tcpi_retransmits, bytes 0 and 2): SYN_SENT with
 * a retransmission means its first SYN got no answer, the filter's drop.
 */
function clientTcpState(socket: net.Socket): { state: number; retransmits: number } {
  const koffi = createRequire(import.meta.url)('koffi') as typeof import('koffi');
  const getsockopt = koffi.load('libc.so.6').func('int getsockopt(int fd, int level, int name, _Out_ void *value, _Inout_ uint32_t *size)');
  const fd = (socket as unknown as { _handle?: { fd: number } })._handle?.fd ?? -1;
  if (fd < 0) return { state: -1, retransmits: 0 }; // libuv opens the socket on the next tick
  const info = Buffer.alloc(256);
  if (getsockopt(fd, 6 /* IPPROTO_TCP */, 11 /* TCP_INFO */, info, [info.length]) !== 0) throw new Error(`getsockopt(TCP_INFO) on fd ${fd}: errno ${koffi.errno()}`);
  return { state: info.readUInt8(0), retransmits: info.readUInt8(2) };
}

const kernel = linuxSockets();
let listener: Listener | null = null;
afterEach(async () => {
  await listener?.worker.terminate();
  listener = null;
});

describe('the kernel calls, on a real listen socket', () => {
  beforeEach((ctx) => {
    if (process.platform !== 'linux') ctx.skip(`${HARDWARE} Linux (the drain's kernel calls are Linux's)`);
  });

  it('binds on Linux, finds the listen socket by port, and reads its accept queue', async () => {
    if (kernel instanceof Error) throw kernel;
    listener = await startListener();
    expect(kernel.listenSockets(listener.port)).toEqual([listener.fd]);
    expect(kernel.acceptQueueLength(listener.fd)).toBe(0);
    await listener.park();
    const clients = Array.from({ length: 4 }, () => ping(listener!.port));
    await Promise.all(clients.map((c) => c.connected)); // the kernel completes handshakes on its own
    expect(kernel.acceptQueueLength(listener.fd)).toBe(4);
    expect(kernel.halfOpen(listener.port)).toBe(0);
    listener.wake(1);
    expect(await Promise.all(clients.map((c) => c.result))).toEqual(['pong', 'pong', 'pong', 'pong']);
    await listener.close();
  });

  it('control: closing the listen socket resets the connections in its accept queue', async () => {
    listener = await startListener();
    await listener.park();
    const clients = Array.from({ length: 4 }, () => ping(listener!.port));
    await Promise.all(clients.map((c) => c.connected));
    listener.wake(2);
    expect(await Promise.all(clients.map((c) => c.result))).toEqual(['ECONNRESET', 'ECONNRESET', 'ECONNRESET', 'ECONNRESET']);
  });

  it('quieted first, the queued connections are all answered; one opened meanwhile is refused after the close, not reset', async () => {
    listener = await startListener();
    await listener.park();
    const queued = Array.from({ length: 4 }, () => ping(listener!.port));
    await Promise.all(queued.map((c) => c.connected));
    const quiet = quietListenSockets(listener.port, { timeoutMs: 10_000 }); // the filter is on when this returns
    const late = ping(listener.port);
    let lateConnected = false;
    void late.connected.then(() => (lateConnected = true));
    // Its SYN was dropped: the kernel resends it after its first timeout (1 s) and it is still not
    // connected, nor queued behind the four: no connection the close could reset.
    await eventually('the late SYN resent, unanswered', async () => clientTcpState(late.socket), (t) => t.retransmits >= 1, 10_000);
    expect(clientTcpState(late.socket).state).toBe(TCP_SYN_SENT);
    expect(lateConnected).toBe(false);
    expect(kernel instanceof Error ? kernel : kernel.acceptQueueLength(listener.fd)).toBe(4);
    listener.wake(1);
    const out = await quiet;
    expect(out).toMatchObject({ sockets: 1, filtered: true, left: 0 });
    expect(await Promise.all(queued.map((c) => c.result))).toEqual(['pong', 'pong', 'pong', 'pong']);
    await listener.close();
    expect(await late.result).toBe('ECONNREFUSED'); // its SYN retried, a second later, found the port closed
  }, 20_000);
});
