#!/usr/bin/env bash
# python3 -m tigon.finetune with the Python that has the client's packages: Debian's /usr/bin/python3,
# where scripts/setup.sh installed python3-grpcio and python3-protobuf (a pyenv or conda python3 earlier
# on PATH lacks them), and the client on PYTHONPATH. TIGON_PYTHON names another interpreter.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${TIGON_PYTHON:-/usr/bin/python3}
PYTHONPATH="$ROOT/client/python${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m tigon.finetune "$@"
