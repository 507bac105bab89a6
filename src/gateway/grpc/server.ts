/**
 * The gRPC server of one gateway thread, beside its uWebSockets.js app: the
 * same Infer (slabs, batches) and gate (API keys), so a gRPC call rides in
 * the same batch as an HTTP or WebSocket request.
 *
 *   inference.GRPCInferenceService  KServe v2, Triton's repository RPCs (src/gateway/kserve/grpc.ts)
 *   tei.v1.*                        text-embeddings-inference's services (src/gateway/tei/grpc.ts)
 *   slabserve.v1.Outputs            several outputs of one pass (BGE-M3's dense, sparse, colbert: outputs.ts)
 *   grpc.health.v1.Health           SERVING per service while ready and able to serve it; NOT_SERVING
 *                                   while warming up or draining (health.ts)
 *   grpc.reflection.v1(alpha)       so grpcurl-style tools list and call the services (@grpc/reflection)
 *
 * Served by @grpc/grpc-js. Every gateway thread binds the port with
 * SO_REUSEPORT (gateway/grpc/reuseport.ts) and hands each
 * connection it accepts to grpc-js through a connection injector, so the
 * kernel spreads gRPC connections across the gateways as it does HTTP's.
 * Messages larger than --max-body-bytes are refused by grpc-js
 * (RESOURCE_EXHAUSTED) before they are parsed.
 */
import { createServer, type Server as NetServer } from 'node:net';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import { loadSync, type PackageDefinition } from '@grpc/proto-loader';
import { ReflectionService } from '@grpc/reflection';
import { protoPath as healthProto, type ServingStatus } from 'grpc-health-check';
import type { Task } from '../../shared/model-format/model-config.js';
import { listenShared } from './reuseport.js';
import type { GrpcDeps } from './calls.js';
import { addFollowedHealth } from './health.js';
import { kserveService, type KServeDeps } from '../kserve/grpc.js';
import { OpenStreams } from './open-streams.js';
import { outputsServices } from './outputs.js';
import { teiServices } from '../tei/grpc.js';

/** What the gateway tells its gRPC server (src/gateway/thread.ts GatewayWorkerData.grpc). */
export interface GrpcListen {
  /** A numeric address (the main thread resolved --host). */
  address: string;
  /** 0: a port the kernel picks (the first gRPC thread binds it; GatewaySupervisor gives the others that port). */
  port: number;
  /** Most messages of one stream answered at once (--grpc-stream-max-inflight). */
  streamMaxInflight: number;
  /** Whether other threads or processes bind the port too (SO_REUSEPORT); false: bound so that nothing else can join it. */
  shared: boolean;
}

/** How proto-loader reads messages: field names as in the .proto, int64 as numbers, enums by name, unset fields absent. */
const LOAD_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: false, oneofs: true } as const;

/** The package's proto/ folder (this file is dist/src/gateway/grpc/server.js). */
export const PROTO_DIR = fileURLToPath(new URL('../../../../proto/', import.meta.url));

let definition: PackageDefinition | undefined;

/** proto/inference.proto, proto/tei.proto, proto/slabserve.proto and the health service, loaded once per thread. */
export function grpcDefinition(): PackageDefinition {
  return (definition ??= loadSync([`${PROTO_DIR}inference.proto`, `${PROTO_DIR}tei.proto`, `${PROTO_DIR}slabserve.proto`, healthProto], LOAD_OPTIONS));
}

/** Each service that serves only while a model of its task is served. */
const SERVICE_TASKS: Record<string, Task | null> = {
  '': null,
  'inference.GRPCInferenceService': null,
  'tei.v1.Info': null,
  'tei.v1.Tokenize': null,
  'tei.v1.Embed': 'embed',
  'tei.v1.Predict': 'classify',
  'tei.v1.Rerank': 'rerank',
  'slabserve.v1.Outputs': 'embed',
};

/** How long close() waits for open calls to end and their last frames to go out. */
const CLOSE_GRACE_MS = 1000;

export interface GatewayGrpc {
  /** The port it listens on (the kernel's pick when asked for port 0). */
  readonly port: number;
  /** Health statuses follow readiness now (the server turned ready, a model came or went), not at the next poll. */
  refreshHealth(): void;
  /** The drain's first step: no new connection; each open one is told (GOAWAY) to start no new call. */
  stopListening(): void;
  /** Every connection closed once its calls have ended, at most CLOSE_GRACE_MS from now (calls still open then are cancelled). */
  close(): Promise<void>;
}

/** Starts this gateway's gRPC server on `listen`; resolves once it listens. */
export async function startGatewayGrpc(given: Omit<KServeDeps, 'streams'> & { tokenizationWorkers: number }, listen: GrpcListen): Promise<GatewayGrpc> {
  const streams = new OpenStreams();
  const deps = { ...given, streams };
  const def = grpcDefinition();
  const loaded = grpc.loadPackageDefinition(def) as unknown as {
    inference: { GRPCInferenceService: { service: grpc.ServiceDefinition } };
    tei: { v1: Record<string, { service: grpc.ServiceDefinition }> };
    slabserve: { v1: Record<string, { service: grpc.ServiceDefinition }> };
  };
  const server = new grpc.Server({ 'grpc.max_receive_message_length': deps.limits.maxBodyBytes, 'grpc.max_send_message_length': -1 });
  server.addService(loaded.inference.GRPCInferenceService.service, kserveService(deps) as unknown as grpc.UntypedServiceImplementation);
  const tei = teiServices(deps, deps.version, deps.tokenizationWorkers);
  for (const [name, impl] of Object.entries(tei)) server.addService(loaded.tei.v1[name]!.service, impl as unknown as grpc.UntypedServiceImplementation);
  for (const [name, impl] of Object.entries(outputsServices(deps))) server.addService(loaded.slabserve.v1[name]!.service, impl as unknown as grpc.UntypedServiceImplementation);
  const health = addFollowedHealth(server, () => healthStatuses(deps));
  new ReflectionService(def).addToServer(server);

  const injector = server.createConnectionInjector(grpc.ServerCredentials.createInsecure());
  const net: NetServer = createServer((socket) => injector.injectConnection(socket));
  const port = await listenShared(net, listen.address, listen.port, listen.shared);
  let listening = true;
  const stopListening = () => {
    if (!listening) return;
    listening = false;
    health.refresh(); // draining: NOT_SERVING now, before any connection closes
    net.close();
    streams.drain(); // each open stream answers what it has read, then ends OK
    injector.drain(2 ** 31 - 1); // GOAWAY now; each connection closes once its calls have ended, or at close()
  };
  return {
    port,
    refreshHealth: health.refresh,
    stopListening,
    async close() {
      stopListening();
      health.close();
      // The last answers and statuses are written before the connections go; a call still open
      // after the grace (a health Watch, a reader that does not read) is cancelled.
      await new Promise<void>((resolve) => {
        const force = setTimeout(() => {
          server.forceShutdown();
          resolve();
        }, CLOSE_GRACE_MS);
        server.tryShutdown(() => {
          clearTimeout(force);
          resolve();
        });
      });
    },
  };
}

/** Each service's status now: SERVING when ready and a model of its task is served. */
function healthStatuses(deps: GrpcDeps): Record<string, ServingStatus> {
  const ready = deps.ready();
  const tasks = new Set(deps.infer.models.list().map((m) => m.plan.spec.task));
  return Object.fromEntries(Object.entries(SERVICE_TASKS).map(([service, task]) => [service, ready && (task === null || tasks.has(task)) ? 'SERVING' : 'NOT_SERVING']));
}
