# tigon-server on CUDA 13 (H100/H200, sm_90). Build: docker build -t tigon:0.1.0 .
# Run:   docker run --gpus all -p 50051:50051 -v $PWD/tokens:/etc/tigon/tokens:ro -v ckpt:/var/lib/tigon tigon:0.1.0
# The server needs a token file (server/README.md, Auth) at /etc/tigon/tokens, or TIGON_ALLOW_NO_AUTH=1;
# metrics stay inside the container unless TIGON_METRICS_LISTEN (with TIGON_METRICS_TOKEN_FILE) says
# otherwise; TIGON_LISTEN and TIGON_TLS_* move the port and turn on TLS, and the HEALTHCHECK follows them
# (deploy/docker/entrypoint.sh lists the variables).
# The same dependencies and build as deploy/device/README.md: gRPC/protobuf/spdlog from the distribution, found before
# LibTorch (the pip torch wheel's CMake package); the server never compiles against torch headers.
ARG CUDA_VERSION=13.0.0
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build git pkg-config python3 python3-venv \
      libgrpc++-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libspdlog-dev libfmt-dev \
      nlohmann-json3-dev prometheus-cpp-dev libgtest-dev libnccl-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/torch && /opt/torch/bin/pip install --no-cache-dir torch --index-url https://download.pytorch.org/whl/cu130
WORKDIR /src
COPY . .
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DTIGON_BUILD_TESTS=OFF -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DCMAKE_PREFIX_PATH="$(/opt/torch/bin/python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')" \
    && ninja -C build tigon-server \
    && mkdir -p /out/lib && cp build/server/tigon-server /out/ \
    && cp build/engine/libtigon_engine.so build/kernels/libtigon_kernels.so /out/lib/

FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04
# The -dev packages name the same libraries in every release (the runtime packages' names change with
# the ABI transitions); they pull in the shared libraries the server links.
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++-dev libprotobuf-dev libspdlog-dev prometheus-cpp-dev libnccl2 python3 python3-grpcio \
      python3-protobuf \
    && rm -rf /var/lib/apt/lists/*
# The whole venv: torch's libraries find the CUDA libraries of the nvidia-* wheels by relative rpaths.
COPY --from=build /opt/torch /opt/torch
COPY --from=build /out/tigon-server /usr/local/bin/tigon-server
COPY --from=build /out/lib/ /usr/local/lib/tigon/
COPY client/python/tigon /usr/local/lib/python3/dist-packages/tigon
ENV LD_LIBRARY_PATH=/usr/local/lib/tigon:/opt/torch/lib/python3.12/site-packages/torch/lib PYTHONPATH=/usr/local/lib/python3/dist-packages
RUN useradd --system --uid 10001 --create-home tigon && mkdir -p /var/lib/tigon && chown tigon /var/lib/tigon
USER tigon
EXPOSE 50051
COPY deploy/docker/entrypoint.sh /usr/local/bin/tigon-entrypoint
COPY deploy/docker/healthcheck.py /usr/local/bin/tigon-healthcheck
ENV TIGON_LISTEN=0.0.0.0:50051 TIGON_METRICS_LISTEN=127.0.0.1:9464 TIGON_AUTH_TOKEN_FILE=/etc/tigon/tokens \
    TIGON_CHECKPOINT_ROOT=/var/lib/tigon
# grpc.health.v1 through the client package (no token needed), on TIGON_LISTEN with TIGON_TLS_*.
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s CMD ["python3", "/usr/local/bin/tigon-healthcheck"]
ENTRYPOINT ["tigon-entrypoint"]
# Further tigon-server flags (tigon-server --help); the address, auth, TLS and metrics come from TIGON_*.
CMD []
