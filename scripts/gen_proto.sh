#!/usr/bin/env bash
# Regenerate tx/api/wire/tinker_public_pb2.py (+ .pyi) from tx/api/wire/tinker_public.proto.
#
# Needs grpcio-tools (it bundles protoc), e.g. in a throwaway venv:
#   python -m venv /tmp/protoc-venv && /tmp/protoc-venv/bin/pip install grpcio-tools
#   PROTOC_PYTHON=/tmp/protoc-venv/bin/python scripts/gen_proto.sh
# The protoc inside grpcio-tools must not be newer than the protobuf runtime tx runs with
# (generated modules check this on import).
#
# The include root is the proto's own folder, so the file registers as "tinker_public.proto"
# exactly as the SDK's does; tests/unit/wire/test_proto_schema.py checks that the serialized
# descriptor is byte-identical to the SDK's, which also lets both modules load in one process.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wire_dir="$repo_root/tx/api/wire"
python="${PROTOC_PYTHON:-python}"

"$python" -m grpc_tools.protoc \
    --proto_path="$wire_dir" \
    --python_out="$wire_dir" \
    --pyi_out="$wire_dir" \
    "$wire_dir/tinker_public.proto"

echo "generated: $wire_dir/tinker_public_pb2.py $wire_dir/tinker_public_pb2.pyi"
