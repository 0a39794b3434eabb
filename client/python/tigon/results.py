"""Small typed results returned by the client."""
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass(frozen=True)
class StepResult:
    step: int                  # optimizer steps taken so far (after this call)
    loss: float                # mean loss per target token of this call's batch
    tokens: int                # target tokens in this call's batch
    grad_norm: float           # global gradient norm before clipping (optimizer steps)
    lr: float                  # learning rate used (optimizer steps)
    wall_seconds: float        # time inside the engine
    tokens_per_second: float
    peak_memory_bytes: int     # peak allocated device memory during the call (CPU: 0)
    peak_reserved_bytes: int
    accumulated_batches: int   # forward_backward calls whose gradients are pending
    replayed: bool = False     # a retried request id: the first call's result, not applied again
    # The objective's own figures (loss_fn): e.g. ppo's clip_fraction, dpo's reward_accuracy.
    metrics: Dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, m):
        return cls(step=m.step, loss=m.loss, tokens=m.tokens, grad_norm=m.grad_norm, lr=m.lr,
                   wall_seconds=m.wall_seconds, tokens_per_second=m.tokens_per_second,
                   peak_memory_bytes=m.peak_allocated_bytes, peak_reserved_bytes=m.peak_reserved_bytes,
                   accumulated_batches=m.accumulated_batches, replayed=m.replayed, metrics=dict(m.metrics))


@dataclass(frozen=True)
class ForwardResult:
    loss: float
    tokens: int
    # log p(label) per position, shape [batch, seq_len] (numpy array when numpy is installed, else
    # lists), 0 where the label is ignored; None unless requested with return_logprobs=True.
    logprobs: Optional[object]
    wall_seconds: float
    metrics: Dict[str, float] = field(default_factory=dict)  # as StepResult.metrics


@dataclass(frozen=True)
class CheckpointResult:
    path: str    # relative to the server's checkpoint root
    step: int    # the session's step after the call
    wall_seconds: float


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    model_family: str
    precision: str
    parameter_count: int
    vocab_size: int
    max_position_embeddings: int
    ops: Dict[str, str]        # op -> "fused" | "reference"
    fused_ops: List[str]
    devices: List[int]
    step: int
    accumulated_batches: int
    optimizer: Dict[str, float]
    seed: int
    optimizer_in_backward: bool = False
    world_size: int = 0  # > 0: one rank of a session over several servers
    rank: int = 0

    @classmethod
    def from_proto(cls, m):
        o = m.optimizer
        return cls(session_id=m.session_id, model_family=m.model_family, precision=m.precision,
                   parameter_count=m.parameter_count, vocab_size=m.vocab_size,
                   max_position_embeddings=m.max_position_embeddings,
                   ops={s.op: s.choice for s in m.ops}, fused_ops=list(m.fused_ops),
                   devices=list(m.devices), step=m.step, accumulated_batches=m.accumulated_batches,
                   optimizer=dict(lr=o.lr, beta1=o.beta1, beta2=o.beta2, eps=o.eps,
                                  weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm),
                   seed=m.seed, optimizer_in_backward=m.optimizer_in_backward, world_size=m.world_size,
                   rank=m.rank)


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class ServerInfo:
    version: str
    engine_version: str
    model_families: List[str]
    devices: List[DeviceInfo]   # empty: the server runs on the CPU
    max_sessions: int
    max_batch_tokens: int
    max_message_bytes: int
    auth_required: bool
    checkpoints_enabled: bool
    active_sessions: int
    uptime_seconds: float

    @classmethod
    def from_proto(cls, m):
        return cls(version=m.version, engine_version=m.engine_version,
                   model_families=list(m.model_families),
                   devices=[DeviceInfo(d.index, d.name, d.total_bytes, d.free_bytes) for d in m.devices],
                   max_sessions=m.limits.max_sessions, max_batch_tokens=m.limits.max_batch_tokens,
                   max_message_bytes=m.limits.max_message_bytes, auth_required=m.auth_required,
                   checkpoints_enabled=m.checkpoints_enabled, active_sessions=m.active_sessions,
                   uptime_seconds=m.uptime_seconds)


@dataclass(frozen=True)
class KernelMeasurement:
    kernels: str               # "fused" | "reference"
    peak_memory_bytes: int     # peak allocated device memory of a training step (CPU: 0)
    peak_reserved_bytes: int
    step_seconds: float
    tokens_per_second: float


@dataclass(frozen=True)
class SavingsResult:
    fused: KernelMeasurement
    reference: KernelMeasurement
    saved_bytes: int           # reference peak - fused peak
    speedup: float             # reference step time / fused step time

    @classmethod
    def from_proto(cls, m):
        def one(k):
            return KernelMeasurement(kernels=k.kernels, peak_memory_bytes=k.peak_allocated_bytes,
                                     peak_reserved_bytes=k.peak_reserved_bytes, step_seconds=k.step_seconds,
                                     tokens_per_second=k.tokens_per_second)
        return cls(fused=one(m.fused), reference=one(m.reference), saved_bytes=m.saved_bytes, speedup=m.speedup)
