# syntax=docker/dockerfile:1
#
# slabserve on a GPU: the CUDA 13 runtime with cuDNN 9 (what onnxruntime's CUDA 13
# provider needs), Node.js 20 from the official release tarball (checksum pinned),
# the production dependencies only, the CUDA provider placed beside onnxruntime-node's
# binding (npm run cuda:install), and the generated default models.
#
#   docker build -t slabserve .
#   docker run --gpus all -p 8080:8080 slabserve
#
# On a machine without a GPU the same image serves on the CPU (SLABSERVE_DEVICE=auto).
# docs/deployment.md has the details.

ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
ARG NODE_VERSION=20.20.2
# sha256 of node-v20.20.2-linux-x64.tar.xz (nodejs.org/dist/v20.20.2/SHASUMS256.txt)
ARG NODE_SHA256=df770b2a6f130ed8627c9782c988fda9669fa23898329a61a871e32f965e007d

# ---------------------------------------------------------------- base: CUDA + cuDNN + Node.js
FROM ${CUDA_IMAGE} AS base
ARG NODE_VERSION
ARG NODE_SHA256
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates curl xz-utils; \
    curl -fsSLo /tmp/node.tar.xz "https://nodejs.org/dist/v${NODE_VERSION}/node-v${NODE_VERSION}-linux-x64.tar.xz"; \
    echo "${NODE_SHA256}  /tmp/node.tar.xz" | sha256sum -c -; \
    tar -xJf /tmp/node.tar.xz -C /usr/local --strip-components=1 --no-same-owner; \
    rm /tmp/node.tar.xz; \
    apt-get purge -y --auto-remove curl xz-utils; \
    rm -rf /var/lib/apt/lists/*; \
    node --version; npm --version
WORKDIR /app

# ---------------------------------------------------------------- build: dev dependencies, tsc, models
# (tsconfig.json also lists bench/*.ts; the benchmarks are not part of the image, so not copied)
FROM base AS build
# .npmrc: onnxruntime-node-install=skip (onnxruntime-node's own CUDA download is not used)
COPY package.json package-lock.json .npmrc ./
RUN npm ci --no-audit --no-fund
COPY tsconfig.json ./
COPY src ./src
COPY models ./models
RUN npx tsc -p tsconfig.json \
 && node dist/models/generate.js --missing

# ---------------------------------------------------------------- runtime: production dependencies + dist
FROM base AS runtime
ENV NODE_ENV=production
COPY package.json package-lock.json .npmrc ./
RUN npm ci --omit=dev --no-audit --no-fund \
 && npm cache clean --force
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
