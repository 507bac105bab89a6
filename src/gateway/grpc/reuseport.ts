/**
 * A TCP listen socket that several threads and processes bind on one port,
 * the kernel spreading connections across them (SO_REUSEPORT), as uSockets
 * binds the HTTP port for the gateways: the gRPC server of each gateway
 * thread (src/gateway/grpc/server.ts). Node's own net does it from Node.js
 * 22.12 (`listen({ reusePort })`); on an older Node the socket is made
 * through koffi (as src/main/drain/kernel-sockets.ts's calls) and the net.Server takes
 * it with `listen({fd})`. Linux only, as SO_REUSEPORT's spreading.
 */
import { createRequire } from 'node:module';
import type { AddressInfo, Server } from 'node:net';

/** Whether this Node's net sets SO_REUSEPORT itself (`reusePort`: Node.js 22.12, 23.1 and later). */
export const NET_REUSE_PORT = ((): boolean => {
  const [major, minor] = process.versions.node.split('.').map(Number) as [number, number];
  return major > 23 || (major === 23 && minor >= 1) || (major === 22 && minor >= 12);
})();

/**
 * `server` listening on `address` (numeric) and `port` (0: one the kernel picks), shared with other
 * threads and processes (SO_REUSEPORT) when `shared`, else bound so that nothing else can join it.
 * Resolves with the port; rejects with the bind's error (`code` EADDRINUSE, ...).
 */
export function listenShared(server: Server, address: string, port: number, shared: boolean): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    const listening = (bound: number) => () => {
      server.off('error', reject);
      resolve(bound || (server.address() as AddressInfo).port);
    };
    // exclusive: a cluster worker binds its own socket, not one shared through the primary.
    if (NET_REUSE_PORT) server.listen({ host: address, port, reusePort: shared, exclusive: true }, listening(0));
    else {
      const socket = listenReusePort(address, port, shared);
      server.listen({ fd: socket.fd }, listening(socket.port));
    }
  });
}

const AF_INET = 2;
const AF_INET6 = 10;
const SOCK_STREAM = 1;
const SOCK_NONBLOCK = 0o4000;
const SOCK_CLOEXEC = 0o2000000;
const SOL_SOCKET = 1;
const SO_REUSEADDR = 2;
const SO_REUSEPORT = 15;
const IPPROTO_IPV6 = 41;
const IPV6_V6ONLY = 26;
/** As net.Server's default. */
const BACKLOG = 511;

interface Libc {
  socket(domain: number, type: number, protocol: number): number;
  setsockopt(fd: number, level: number, name: number, value: Buffer, size: number): number;
  bind(fd: number, addr: Buffer, size: number): number;
  listen(fd: number, backlog: number): number;
  getsockname(fd: number, addr: Buffer, size: number[]): number;
  inet_pton(af: number, src: string, dst: Buffer): number;
  close(fd: number): number;
  errno(): number;
}

let libc: Libc | Error | undefined;

function bindLibc(): Libc | Error {
  if (process.platform !== 'linux') return new Error(`SO_REUSEPORT spreading is Linux's (this is ${process.platform})`);
  try {
    const koffi = createRequire(import.meta.url)('koffi') as typeof import('koffi');
    const c = koffi.load('libc.so.6');
    return {
      socket: c.func('int socket(int domain, int type, int protocol)'),
      setsockopt: c.func('int setsockopt(int fd, int level, int name, const void *value, uint32_t size)'),
      bind: c.func('int bind(int fd, const void *addr, uint32_t size)'),
      listen: c.func('int listen(int fd, int backlog)'),
      getsockname: c.func('int getsockname(int fd, _Out_ void *addr, _Inout_ uint32_t *size)'),
      inet_pton: c.func('int inet_pton(int af, const char *src, _Out_ void *dst)'),
      close: c.func('int close(int fd)'),
      errno: () => koffi.errno(),
    };
  } catch (err) {
    return new Error(`koffi did not load: ${(err as Error).message}`);
  }
}

/** errno values a bind reports that an operator can act on. */
const ERRNO_NAMES: Record<number, string> = { 98: 'EADDRINUSE', 99: 'EADDRNOTAVAIL', 13: 'EACCES' };

/**
 * A listening socket on `address` (a numeric IPv4 or IPv6 address: resolve
 * names first) and `port`, with SO_REUSEPORT, non-blocking: its file
 * descriptor, for `net.Server.listen({fd})`, and the port it is bound to.
 * Port 0 binds a port the kernel picks, free at that moment: the first
 * thread binds it so, the others join the port it got (a port picked
 * beforehand and bound later may meanwhile be picked by another process of
 * the same user, whose SO_REUSEPORT bind would then share it). Throws with errno's name.
 */
export function listenReusePort(address: string, port: number, reusePort = true): { fd: number; port: number } {
  const c = (libc ??= bindLibc());
  if (c instanceof Error) throw c;
  const v6 = address.includes(':');
  const addr = Buffer.alloc(v6 ? 28 : 16); // sockaddr_in6 / sockaddr_in
  addr.writeUInt16LE(v6 ? AF_INET6 : AF_INET, 0);
  addr.writeUInt16BE(port, 2);
  if (c.inet_pton(v6 ? AF_INET6 : AF_INET, address, addr.subarray(v6 ? 8 : 4)) !== 1) throw new Error(`${address} is not a numeric IP address`);
  const fd = c.socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) throw new Error(`socket(): errno ${c.errno()}`);
  const one = Buffer.alloc(4);
  one.writeInt32LE(1, 0);
  const zero = Buffer.alloc(4);
  const step = (ok: boolean, what: string) => {
    if (ok) return;
    const errno = c.errno();
    c.close(fd);
    throw Object.assign(new Error(`${what} on ${address}:${port}: ${ERRNO_NAMES[errno] ?? `errno ${errno}`}`), { code: ERRNO_NAMES[errno] });
  };
  step(c.setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, one, 4) === 0, 'setsockopt(SO_REUSEADDR)');
  if (reusePort) step(c.setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, one, 4) === 0, 'setsockopt(SO_REUSEPORT)');
  if (v6) step(c.setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, zero, 4) === 0, 'setsockopt(IPV6_V6ONLY)'); // "::" takes IPv4 too, as Node's
  step(c.bind(fd, addr, addr.length) === 0, 'bind');
  step(c.listen(fd, BACKLOG) === 0, 'listen');
  const bound = Buffer.alloc(addr.length);
  step(c.getsockname(fd, bound, [bound.length]) === 0, 'getsockname');
  return { fd, port: bound.readUInt16BE(2) };
}
