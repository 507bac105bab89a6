/**
 * The few socket calls the drain needs and Node does not expose (Linux only),
 * made through koffi, a maintained FFI with prebuilt binaries (no compiler at
 * install): find this process's listen sockets on a port, read an accept
 * queue's length, count the handshakes half done on a port, and attach the
 * filter that drops new connections. Used by src/main/drain/accept-queue.ts.
 */
import { readdirSync, readlinkSync } from 'node:fs';
import { createRequire } from 'node:module';

/** What src/main/drain/accept-queue.ts needs from the kernel; tests give it a fake. */
export interface KernelSockets {
  /** File descriptors of this process's TCP listen sockets on `port`. */
  listenSockets(port: number): number[];
  /** Connections waiting in `fd`'s accept queue (handshake done, not accepted yet). */
  acceptQueueLength(fd: number): number;
  /** Handshakes on `port` the kernel answered but that have no socket yet (SYN_RECV), in this network namespace. */
  halfOpen(port: number): number;
  /** From now on `fd` drops SYNs that open a connection; the rest of its traffic passes. */
  dropNewConnections(fd: number): void;
}

const AF_INET = 2;
const AF_INET6 = 10;
const AF_NETLINK = 16;
const SOCK_DGRAM = 2;
const SOCK_CLOEXEC = 0o2000000;
const NETLINK_SOCK_DIAG = 4;
const SOCK_DIAG_BY_FAMILY = 20;
const NLM_F_REQUEST = 0x1;
const NLM_F_DUMP = 0x300;
const NLMSG_ERROR = 2;
const NLMSG_DONE = 3;
const SOL_SOCKET = 1;
const SO_ACCEPTCONN = 30;
const SO_PROTOCOL = 38;
const SO_ATTACH_FILTER = 26;
const IPPROTO_TCP = 6;
const TCP_INFO = 11;
/** Offset of tcpi_unacked in struct tcp_info: for a listen socket, its accept queue's length. */
const TCPI_UNACKED = 24;
const TCP_SYN_RECV = 3;

/**
 * The classic BPF program: a TCP socket filter sees a segment from its TCP
 * header, whose byte 13 holds the flags. SYN without ACK (a new connection)
 * is dropped, so the client retries it a second later; everything else passes,
 * the ACK that ends a handshake already under way included. Connections
 * accepted later inherit the filter, which never drops their traffic.
 */
const DROP_NEW_SYNS = [
  { code: 0x30, jt: 0, jf: 0, k: 13 }, // ldb [13]
  { code: 0x54, jt: 0, jf: 0, k: 0x12 }, // and #(SYN|ACK)
  { code: 0x15, jt: 0, jf: 1, k: 0x02 }, // jeq #SYN, drop, pass
  { code: 0x06, jt: 0, jf: 0, k: 0 }, // drop: ret #0
  { code: 0x06, jt: 0, jf: 0, k: 0xffffffff }, // pass: ret #-1 (the whole segment)
];

let bound: KernelSockets | Error | undefined;

/** The bound libc calls (bound once per thread), or why they could not be bound. */
export function linuxSockets(): KernelSockets | Error {
  if (process.platform !== 'linux') return new Error(`socket filters are Linux's (this is ${process.platform})`);
  try {
    return (bound ??= bind(createRequire(import.meta.url)('koffi') as typeof import('koffi')));
  } catch (err) {
    return (bound = new Error(`koffi did not load: ${(err as Error).message}`));
  }
}

function bind(koffi: typeof import('koffi')): KernelSockets {
  const libc = koffi.load('libc.so.6');
  const filter = koffi.struct('slabserve_sock_filter', { code: 'uint16', jt: 'uint8', jf: 'uint8', k: 'uint32' });
  const fprog = koffi.struct('slabserve_sock_fprog', { len: 'uint16', filter: koffi.pointer(filter) });
  const setFilter = libc.func('int setsockopt(int fd, int level, int name, _In_ slabserve_sock_fprog *value, uint32_t size)');
  const getsockopt = libc.func('int getsockopt(int fd, int level, int name, _Out_ void *value, _Inout_ uint32_t *size)');
  const getsockname = libc.func('int getsockname(int fd, _Out_ void *addr, _Inout_ uint32_t *size)');
  const socket = libc.func('int socket(int domain, int type, int protocol)');
  const send = libc.func('intptr_t send(int fd, const void *buf, uintptr_t len, int flags)');
  const recv = libc.func('intptr_t recv(int fd, _Out_ void *buf, uintptr_t len, int flags)');
  const close = libc.func('int close(int fd)');
  const fail = (what: string): never => {
    throw new Error(`${what}: errno ${koffi.errno()}`);
  };

  const intOption = (fd: number, level: number, name: number): number | null => {
    const value = Buffer.alloc(4);
    return getsockopt(fd, level, name, value, [4]) === 0 ? value.readInt32LE(0) : null;
  };
  const localPort = (fd: number): number | null => {
    const addr = Buffer.alloc(128);
    if (getsockname(fd, addr, [128]) !== 0) return null;
    const family = addr.readUInt16LE(0);
    return family === AF_INET || family === AF_INET6 ? addr.readUInt16BE(2) : null;
  };

  /** SYN_RECV entries of one address family on `port`, from a sock_diag dump (what `ss` reads). */
  const halfOpenOf = (family: number, port: number): number => {
    const fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (fd < 0) fail('socket(AF_NETLINK)');
    try {
      const req = Buffer.alloc(16 + 56); // nlmsghdr + inet_diag_req_v2
      req.writeUInt32LE(req.length, 0);
      req.writeUInt16LE(SOCK_DIAG_BY_FAMILY, 4);
      req.writeUInt16LE(NLM_F_REQUEST | NLM_F_DUMP, 6);
      req.writeUInt8(family, 16);
      req.writeUInt8(IPPROTO_TCP, 17);
      req.writeUInt32LE(1 << TCP_SYN_RECV, 20); // idiag_states
      if (send(fd, req, req.length, 0) !== req.length) fail('send(sock_diag)');
      const buf = Buffer.alloc(64 * 1024);
      let n = 0;
      for (;;) {
        const got = Number(recv(fd, buf, buf.length, 0));
        if (got <= 0) fail('recv(sock_diag)');
        for (let at = 0; at + 16 <= got; ) {
          const len = buf.readUInt32LE(at);
          const type = buf.readUInt16LE(at + 4);
          if (type === NLMSG_DONE) return n;
          if (type === NLMSG_ERROR) fail(`sock_diag answered error ${-buf.readInt32LE(at + 16)}`);
          // inet_diag_msg: family, state, timer, retrans, then the id whose first field is the local port
          if (buf.readUInt8(at + 17) === TCP_SYN_RECV && buf.readUInt16BE(at + 20) === port) n++;
          at += (len + 3) & ~3;
        }
      }
    } finally {
      close(fd);
    }
  };

  return {
    listenSockets: (port) =>
      ownSocketFds().filter(
        (fd) => intOption(fd, SOL_SOCKET, SO_ACCEPTCONN) === 1 && intOption(fd, SOL_SOCKET, SO_PROTOCOL) === IPPROTO_TCP && localPort(fd) === port,
      ),
    acceptQueueLength: (fd) => {
      const info = Buffer.alloc(256);
      if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, info, [info.length]) !== 0) fail(`getsockopt(TCP_INFO) on fd ${fd}`);
      return info.readUInt32LE(TCPI_UNACKED);
    },
    halfOpen: (port) => halfOpenOf(AF_INET, port) + halfOpenOf(AF_INET6, port),
    dropNewConnections: (fd) => {
      if (setFilter(fd, SOL_SOCKET, SO_ATTACH_FILTER, { len: DROP_NEW_SYNS.length, filter: DROP_NEW_SYNS }, koffi.sizeof(fprog)) !== 0) {
        fail(`setsockopt(SO_ATTACH_FILTER) on fd ${fd}`);
      }
    },
  };
}

/** Every socket this process holds, by file descriptor. */
function ownSocketFds(): number[] {
  const fds: number[] = [];
  for (const name of readdirSync('/proc/self/fd')) {
    try {
      if (readlinkSync(`/proc/self/fd/${name}`).startsWith('socket:')) fds.push(Number(name));
    } catch {
      // closed meanwhile
    }
  }
  return fds;
}
