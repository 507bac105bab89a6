"""A gRPC load generator for bench/grpc.ts (grpcio's asyncio API over the C
core), each message a distinct short text so the result cache never answers,
for `seconds`:

  unary   `connections` closed loops of tei.v1.Embed/Embed, a channel each
  stream  one tei.v1.Embed/EmbedStream on one channel, `connections` messages in flight

argv: target seconds connections tei.proto [unary|stream]
stdout: one JSON line {"requests", "errors", "seconds", "p50_ms", "p99_ms", "cpu_s"}
(cpu_s: this process's own CPU, what the load generator cost).
"""
import asyncio
import atexit
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time

import grpc


def message_classes(proto):
    out = tempfile.mkdtemp(prefix="slabserve-grpc-bench-")
    atexit.register(shutil.rmtree, out, True)  # the module stays loaded; its files go with the run
    subprocess.run(["protoc", f"-I{os.path.dirname(proto)}", f"--python_out={out}", proto], check=True)
    sys.path.insert(0, out)
    import tei_pb2  # noqa: E402

    return tei_pb2


async def stream(target, seconds, depth, pb):
    """One stream, `depth` messages in flight; the answers come in order, so each is the oldest sent."""
    channel = grpc.aio.insecure_channel(target)
    call = channel.stream_stream("/tei.v1.Embed/EmbedStream", pb.EmbedRequest.SerializeToString, pb.EmbedResponse.FromString)()
    await call.write(pb.EmbedRequest(inputs="warm"))
    await call.read()
    sent_at = collections.deque()
    latencies = []
    room = asyncio.Semaphore(depth)
    end = time.monotonic() + seconds
    cpu0 = time.process_time()

    async def writer():
        n = 0
        while time.monotonic() < end:
            await room.acquire()
            n += 1
            sent_at.append(time.monotonic())
            await call.write(pb.EmbedRequest(inputs=f"grpc stream message number {n} of the bench"))
        await call.done_writing()

    async def reader():
        while True:
            reply = await call.read()
            if reply is grpc.aio.EOF:
                return
            latencies.append((time.monotonic() - sent_at.popleft()) * 1000)
            room.release()

    started = time.monotonic()
    await asyncio.gather(writer(), reader())
    took = time.monotonic() - started
    cpu = time.process_time() - cpu0
    await channel.close()
    return latencies, 0, took, cpu


async def main():
    target, seconds, connections, proto = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    mode = sys.argv[5] if len(sys.argv) > 5 else "unary"
    pb = message_classes(proto)
    if mode == "stream":
        latencies, errors, took, cpu = await stream(target, seconds, connections, pb)
        report(latencies, errors, took, cpu)
        return
    latencies = []
    errors = 0
    counter = [0]
    # One channel per connection: closed loops on connections of their own, as wrk's.
    channels = [grpc.aio.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(connections)]
    calls = [ch.unary_unary("/tei.v1.Embed/Embed", pb.EmbedRequest.SerializeToString, pb.EmbedResponse.FromString) for ch in channels]
    for c in calls:  # connect before the clock starts
        await c(pb.EmbedRequest(inputs="warm"))
    end = time.monotonic() + seconds
    cpu0 = time.process_time()

    async def loop(call):
        nonlocal errors
        while time.monotonic() < end:
            counter[0] += 1
            t = time.monotonic()
            try:
                await call(pb.EmbedRequest(inputs=f"grpc request number {counter[0]} of the bench"))
                latencies.append((time.monotonic() - t) * 1000)
            except grpc.RpcError:
                errors += 1

    started = time.monotonic()
    await asyncio.gather(*(loop(c) for c in calls))
    took = time.monotonic() - started
    cpu = time.process_time() - cpu0
    for ch in channels:
        await ch.close()
    report(latencies, errors, took, cpu)


def report(latencies, errors, took, cpu):
    latencies.sort()
    q = lambda p: latencies[min(len(latencies) - 1, int(p * len(latencies)))] if latencies else None
    print(f'{{"requests": {len(latencies)}, "errors": {errors}, "seconds": {took:.3f}, "p50_ms": {q(0.5)}, "p99_ms": {q(0.99)}, "cpu_s": {cpu:.3f}}}')


asyncio.run(main())
