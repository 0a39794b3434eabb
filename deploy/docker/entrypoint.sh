#!/usr/bin/env bash
# The image's entrypoint: tigon-server configured from environment variables, which the HEALTHCHECK
# (healthcheck.py) reads too, so the probe follows the address and TLS the server was given. Arguments
# after the image name are passed on as further flags (tigon-server --help).
#
#   TIGON_LISTEN               gRPC address (default 0.0.0.0:50051)
#   TIGON_AUTH_TOKEN_FILE      bearer tokens (default /etc/tigon/tokens; it must exist: the port is
#                              published, so the server does not start without auth unless
#                              TIGON_ALLOW_NO_AUTH=1 says anyone who reaches it may train and read
#                              checkpoints)
#   TIGON_TLS_CERT, TIGON_TLS_KEY, TIGON_TLS_CLIENT_CA   TLS and mutual TLS (--tls-*)
#   TIGON_METRICS_LISTEN       Prometheus metrics (default 127.0.0.1:9464: inside the container only; the
#                              metrics show session ids and losses, so publishing them needs
#                              TIGON_METRICS_TOKEN_FILE, or TIGON_ALLOW_OPEN_METRICS=1)
#   TIGON_METRICS_TOKEN_FILE   bearer tokens for scrapes
#   TIGON_CHECKPOINT_ROOT      default /var/lib/tigon;  TIGON_MODEL_ROOT  optional --model-root
set -euo pipefail
die() { echo "tigon entrypoint: $*" >&2; exit 2; }

listen=${TIGON_LISTEN:-0.0.0.0:50051}
metrics=${TIGON_METRICS_LISTEN:-127.0.0.1:9464}
tokens=${TIGON_AUTH_TOKEN_FILE:-/etc/tigon/tokens}
flags=("--listen=$listen" "--checkpoint-root=${TIGON_CHECKPOINT_ROOT:-/var/lib/tigon}"
       "--log-level=${TIGON_LOG_LEVEL:-info}")

if [[ -f $tokens ]]; then
  flags+=("--auth-token-file=$tokens")
elif [[ ${TIGON_ALLOW_NO_AUTH:-0} != 1 ]]; then
  die "no token file at $tokens: mount one (one token per line, see the server README's Auth), e.g.
  docker run -v \$PWD/tokens:/etc/tigon/tokens:ro ..., set TIGON_AUTH_TOKEN_FILE, or set TIGON_ALLOW_NO_AUTH=1
  to serve without auth (anyone who reaches $listen can train and overwrite checkpoints)"
fi

if [[ -n ${TIGON_TLS_CERT:-} || -n ${TIGON_TLS_KEY:-} ]]; then
  [[ -n ${TIGON_TLS_CERT:-} && -n ${TIGON_TLS_KEY:-} ]] || die "TIGON_TLS_CERT and TIGON_TLS_KEY go together"
  flags+=("--tls-cert=$TIGON_TLS_CERT" "--tls-key=$TIGON_TLS_KEY")
fi
[[ -z ${TIGON_TLS_CLIENT_CA:-} ]] || flags+=("--tls-client-ca=$TIGON_TLS_CLIENT_CA")

metrics_host=${metrics%:*}
if [[ $metrics != off && $metrics_host != 127.0.0.1 && $metrics_host != localhost && $metrics_host != "[::1]" &&
      -z ${TIGON_METRICS_TOKEN_FILE:-} && ${TIGON_ALLOW_OPEN_METRICS:-0} != 1 ]]; then
  die "TIGON_METRICS_LISTEN=$metrics would show every session's id and loss to anyone who reaches it: set
  TIGON_METRICS_TOKEN_FILE (scrapes then need a bearer token), or TIGON_ALLOW_OPEN_METRICS=1"
fi
flags+=("--metrics-listen=$metrics")
[[ -z ${TIGON_METRICS_TOKEN_FILE:-} ]] || flags+=("--metrics-token-file=$TIGON_METRICS_TOKEN_FILE")
[[ -z ${TIGON_MODEL_ROOT:-} ]] || flags+=("--model-root=$TIGON_MODEL_ROOT")

exec "${TIGON_SERVER_BIN:-tigon-server}" "${flags[@]}" "$@"
