"""Python client of tigon-server, Tigon's training-step service.

    import tigon
    client = tigon.connect("127.0.0.1:50051")
    config = dict(model_type="llama", vocab_size=256, hidden_size=64, intermediate_size=128,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    with client.create_session(config, precision="fp32", optimizer=dict(lr=1e-3)) as session:
        for batch in batches:                 # [batch, seq_len] ints: lists or numpy arrays
            result = session.train_step(batch)
            print(result.step, result.loss, result.tokens_per_second)
"""
import sys

try:
    import google.protobuf  # noqa: F401
    import grpc  # noqa: F401
except ImportError as e:
    # The usual cause: a python3 earlier on PATH (pyenv, conda, a venv) that is not the one the packages went to.
    raise ImportError(f"tigon needs grpc and protobuf, which {sys.executable} cannot import ({e}). "
                      "scripts/setup.sh installs them for Debian's /usr/bin/python3 (python3-grpcio, "
                      "python3-protobuf): run the client with /usr/bin/python3, or install grpcio and protobuf "
                      "into this Python") from e

from .client import Client, Future, Session, connect
from .errors import (Aborted, Cancelled, DeadlineExceeded, FailedPrecondition, Internal, InvalidArgument, NotFound,
                     PermissionDenied, ResourceExhausted, TigonError, Unauthenticated, Unavailable)
from .results import (CheckpointResult, DeviceInfo, ForwardResult, KernelMeasurement, SavingsResult, ServerInfo,
                      SessionInfo, StepResult)
from .world import WorldSession

__all__ = [
    "connect", "Client", "Session", "Future", "WorldSession",
    "TigonError", "InvalidArgument", "NotFound", "ResourceExhausted", "Unauthenticated", "PermissionDenied",
    "FailedPrecondition", "DeadlineExceeded", "Unavailable", "Cancelled", "Aborted", "Internal",
    "StepResult", "ForwardResult", "CheckpointResult", "SessionInfo", "ServerInfo", "DeviceInfo",
    "SavingsResult", "KernelMeasurement",
]
__version__ = "0.1.0"
