#!/usr/bin/env bash
# Generates tigon/v1/trainer_pb2.py and trainer_pb2_grpc.py from proto/tigon/v1/trainer.proto with
# protoc and grpc_python_plugin (Debian: protobuf-compiler, protobuf-compiler-grpc).
# The generated files are committed; tests/integration/test_generated_code.py checks they are current.
# Usage: client/python/generate_proto.sh [OUTPUT_DIR]   (default: client/python)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here}
plugin=$(command -v grpc_python_plugin || echo /usr/bin/grpc_python_plugin)
mkdir -p "$out"
protoc --proto_path="$root/proto" --python_out="$out" \
  --plugin=protoc-gen-grpc="$plugin" --grpc_out="$out" \
  "$root/proto/tigon/v1/trainer.proto"
