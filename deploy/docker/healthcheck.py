"""The image's HEALTHCHECK: grpc.health.v1 on the address and with the TLS settings the entrypoint gave
the server (TIGON_LISTEN, TIGON_TLS_*; see entrypoint.sh), so a server moved to another port or to TLS is
still probed correctly. Health needs no token. Exit 0 when SERVING.

TLS: the server's certificate is checked against TIGON_HEALTHCHECK_ROOT_CERT (default: TIGON_TLS_CERT
itself, which suits a self-signed certificate) for the name TIGON_HEALTHCHECK_SERVER_NAME (default: the
probed host); with TIGON_TLS_CLIENT_CA the probe presents TIGON_HEALTHCHECK_CLIENT_CERT and _CLIENT_KEY.
"""
import os
import sys

import tigon

# A wildcard listen address is probed on the loopback of the same family.
LOOPBACK = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "[::]": "[::1]", "::": "[::1]"}


def probe_address(listen):
    host, _, port = listen.rpartition(":")
    return f"{LOOPBACK.get(host, host)}:{port}"


def main():
    env = os.environ
    address = probe_address(env.get("TIGON_LISTEN", "0.0.0.0:50051"))
    tls = bool(env.get("TIGON_TLS_CERT"))
    client = tigon.connect(
        address, tls=tls,
        root_cert=(env.get("TIGON_HEALTHCHECK_ROOT_CERT") or env.get("TIGON_TLS_CERT")) if tls else None,
        client_cert=env.get("TIGON_HEALTHCHECK_CLIENT_CERT") or None,
        client_key=env.get("TIGON_HEALTHCHECK_CLIENT_KEY") or None,
        server_name=env.get("TIGON_HEALTHCHECK_SERVER_NAME") or None)
    try:
        status = client.health(timeout=float(env.get("TIGON_HEALTHCHECK_TIMEOUT", "4")))
    except tigon.TigonError as e:
        print(f"tigon healthcheck: {address}: {e}", file=sys.stderr)
        return 1
    if status != "SERVING":
        print(f"tigon healthcheck: {address} is {status}", file=sys.stderr)
    return 0 if status == "SERVING" else 1


if __name__ == "__main__":
    sys.exit(main())
