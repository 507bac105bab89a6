/**
 * grpc.health.v1.Health for one gateway's gRPC server, following the server's
 * readiness (grpc-health-check holds the statuses and speaks the protocol):
 *
 *   Check, List  read readiness at the call: always exact
 *   Watch        hears of each change; the statuses are compared with
 *                readiness every HEALTH_POLL_MS while a Watch stream is
 *                open, and at once on the changes the gateway is told of
 *                (`refresh`: warm-up over, a model loaded or unloaded, the
 *                drain)
 *
 * With no Watch open nothing polls, so an idle server does not wake for it.
 */
import type * as grpc from '@grpc/grpc-js';
import { HealthImplementation, type ServingStatus } from 'grpc-health-check';

/** How often statuses are compared with readiness while a Watch stream is open. */
const HEALTH_POLL_MS = 250;

export interface FollowedHealth {
  /** Statuses follow readiness now (a change the gateway was told of). */
  refresh(): void;
  /** Stops the poll (the server is closing). */
  close(): void;
}

type Handler = (call: grpc.ServerUnaryCall<unknown, unknown> & grpc.ServerWritableStream<unknown, unknown>, callback: grpc.sendUnaryData<unknown>) => void;

/** Adds the health service to `server`, its statuses `statuses()` (each service's, from readiness). */
export function addFollowedHealth(server: grpc.Server, statuses: () => Record<string, ServingStatus>): FollowedHealth {
  // `shown` is exactly what the health service holds, read once: two reads straddling the turn to
  // ready (start-up under load) once left it NOT_SERVING for good, a refresh seeing no change.
  const shown = statuses();
  const health = new HealthImplementation({ ...shown });
  const refresh = () => {
    for (const [service, status] of Object.entries(statuses())) {
      if (shown[service] === status) continue; // a Watch hears of changes only (the health protocol)
      shown[service] = status;
      health.setStatus(service, status);
    }
  };
  let watching = 0;
  let poll: NodeJS.Timeout | undefined;
  const watched = (delta: 1 | -1) => {
    watching += delta;
    if (watching > 0 && !poll) {
      poll = setInterval(refresh, HEALTH_POLL_MS);
      poll.unref();
    } else if (watching === 0 && poll) {
      clearInterval(poll);
      poll = undefined;
    }
  };
  // The library's handlers, each after a refresh; a Watch counted while open.
  const wrapping = {
    addService(service: grpc.ServiceDefinition, impl: Record<string, Handler>) {
      server.addService(service, {
        check: (call: Parameters<Handler>[0], cb: Parameters<Handler>[1]) => (refresh(), impl.check!(call, cb)),
        list: (call: Parameters<Handler>[0], cb: Parameters<Handler>[1]) => (refresh(), impl.list!(call, cb)),
        watch: (call: Parameters<Handler>[0], cb: Parameters<Handler>[1]) => {
          refresh();
          watched(1);
          call.once('cancelled', () => watched(-1));
          impl.watch!(call, cb);
        },
      } as unknown as grpc.UntypedServiceImplementation);
    },
  };
  health.addToServer(wrapping as unknown as grpc.Server);
  return {
    refresh,
    close() {
      if (poll) clearInterval(poll);
      poll = undefined;
    },
  };
}
