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
