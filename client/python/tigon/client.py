"""The client: `connect` -> `Client` -> `Session`; every call also exists as `*_async` returning a Future
(one definition each: tigon/_calls.py)."""
import dataclasses
import json
import os
import threading
import uuid

import grpc

from . import _batch
from ._calls import Future, _Call, _Deferred, call, with_async_variants
from .errors import Aborted, InvalidArgument, ResourceExhausted, TigonError, Unavailable, from_rpc_error
from .results import CheckpointResult, ForwardResult, SavingsResult, ServerInfo, SessionInfo, StepResult
from .v1 import trainer_pb2 as pb
from .v1 import trainer_pb2_grpc as pb_grpc

_OPTIMIZER_FIELDS = ("lr", "beta1", "beta2", "eps", "weight_decay", "max_grad_norm")
_HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def connect(address, token=None, *, timeout=None, retries=0, tls=False, root_cert=None, client_cert=None,
            client_key=None, server_name=None):
    """A client for the tigon-server at HOST:PORT.

    token: sent as `authorization: Bearer <token>` on every call (servers started with
      --auth-token-file require it).
    timeout: default deadline in seconds for each call (None: no deadline); every method also takes
      `timeout=`.
    retries: how many times a call that is safe to repeat is retried when the server is UNAVAILABLE
      (train_step/optim_step carry a request id, so a retry is never applied twice).
    tls: speak TLS to a server started with --tls-cert (implied by any of the next three).
    root_cert: PEM file (path or bytes) of the CA that signed the server's certificate (default: the
      system's roots).
    client_cert, client_key: PEM certificate chain and private key (paths or bytes) presented to a
      server started with --tls-client-ca (mutual TLS).
    server_name: the name to check the server's certificate against when it differs from HOST.
    """
    return Client(address, token=token, timeout=timeout, retries=retries, tls=tls, root_cert=root_cert,
                  client_cert=client_cert, client_key=client_key, server_name=server_name)


def _pem(value, what):
    """PEM bytes from bytes or a file path (None stays None)."""
    if value is None or isinstance(value, bytes):
        return value
    try:
        with open(os.fspath(value), "rb") as f:
            return f.read()
    except OSError as error:
        raise InvalidArgument(f"cannot read the {what} '{value}': {error.strerror}") from None


def _optimizer_message(message, settings, where):
    """Copies lr/beta1/beta2/eps/weight_decay/max_grad_norm (and betas=(b1, b2)) into an OptimizerSettings."""
    settings = dict(settings or {})
    betas = settings.pop("betas", None)
    if betas is not None:
        if len(betas) != 2:
            raise InvalidArgument(f"{where}: betas must be (beta1, beta2)")
        settings.setdefault("beta1", betas[0])
        settings.setdefault("beta2", betas[1])
    for key, value in settings.items():
        if key not in _OPTIMIZER_FIELDS:
            raise InvalidArgument(f"{where}: unknown optimizer setting '{key}' "
                                  f"(known: {', '.join(_OPTIMIZER_FIELDS)}, betas)")
        if value is not None:
            setattr(message, key, float(value))


@with_async_variants
class Client:
    def __init__(self, address, token=None, timeout=None, retries=0, *, tls=False, root_cert=None,
                 client_cert=None, client_key=None, server_name=None):
        self.address = address
        self._timeout = timeout
        self._retries = retries
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        # The server enforces its own --max-message-bytes; the client does not add a smaller limit.
        # Reconnect quickly after a refused connection: gRPC's default backoff (1 s, growing to 120 s) would
        # keep failing calls fast long after a restarting server is back, defeating `retries`.
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1),
                   ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                   ("grpc.max_reconnect_backoff_ms", 1000)]
        if (client_cert is None) != (client_key is None):
            raise InvalidArgument("client_cert and client_key go together: give both or neither")
        self.tls = bool(tls or root_cert is not None or client_cert is not None)
        if self.tls:
            credentials = grpc.ssl_channel_credentials(
                root_certificates=_pem(root_cert, "root certificate"),
                private_key=_pem(client_key, "client key"),
                certificate_chain=_pem(client_cert, "client certificate"))
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = pb_grpc.TrainerStub(self._channel)

    # ---- plumbing ----

    def _deadline(self, timeout):
        return self._timeout if timeout is None else timeout

    def _call(self, method, request, convert, timeout=None, idempotent=False, **kwargs):
        return _Call(self, method, request, convert, timeout, idempotent, **kwargs)

    def _run(self, call):
        rpc = call.rpc or getattr(self._stub, call.method)
        attempts = 1 + (self._retries if call.idempotent else 0)
        for attempt in range(attempts):
            try:
                return call.convert(rpc(call.request, timeout=self._deadline(call.timeout), metadata=self._metadata))
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.UNAVAILABLE and attempt + 1 < attempts:
                    # Wait (a growing window) for the channel to connect rather than sleeping blind: the
                    # request is sent again only once, right after the server is reachable or the window ends.
                    try:
                        grpc.channel_ready_future(self._channel).result(timeout=min(0.2 * 2 ** attempt, 5.0))
                    except grpc.FutureTimeoutError:
                        pass
                    continue
                error = from_rpc_error(error)
                if call.on_error is not None:
                    call.on_error(error)
                raise error from None

    def _submit(self, call):
        rpc = call.rpc or getattr(self._stub, call.method)
        return Future(rpc.future(call.request, timeout=self._deadline(call.timeout), metadata=self._metadata),
                      call.convert, call.on_error)

    # ---- server ----

    @call
    def server_info(self, *, timeout=None):
        return self._call("GetServerInfo", pb.GetServerInfoRequest(), ServerInfo.from_proto, timeout, True)

    @call
    def list_sessions(self, *, timeout=None):
        return self._call("ListSessions", pb.ListSessionsRequest(),
                          lambda r: [SessionInfo.from_proto(s) for s in r.sessions], timeout, True)

    @call
    def health(self, service="", *, timeout=5.0):
        """The grpc.health.v1 status of the server: "SERVING", "NOT_SERVING", ... (no token needed)."""
        check = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=lambda s: (b"\x0a" + bytes([len(s)]) + s.encode()) if s else b"",
            response_deserializer=lambda data: data[1] if len(data) >= 2 and data[0] == 0x08 else 0)
        return self._call("Health", service, lambda status: _HEALTH_STATUS.get(status, "UNKNOWN"), timeout, True,
                          rpc=check)

    # ---- sessions ----

    @call
    def new_communicator_id(self, *, timeout=None):
        """A fresh communicator id (bytes) for a session spread over several servers (see WorldSession);
        ask the server that will hold rank 0. FailedPrecondition where the server has no NCCL."""
        return self._call("NewCommunicatorId", pb.NewCommunicatorIdRequest(), lambda r: r.communicator_id, timeout)

    def _create_request(self, model, precision, kernels, optimizer, seed, devices, optimizer_in_backward=False,
                        world=None):
        request = pb.CreateSessionRequest(precision=precision, seed=int(seed),
                                          optimizer_in_backward=bool(optimizer_in_backward))
        if world is not None:
            world_size, rank, communicator_id, *timeout = world
            request.world.world_size = int(world_size)
            request.world.rank = int(rank)
            request.world.communicator_id = bytes(communicator_id)
            if timeout and timeout[0] is not None:
                request.world.collective_timeout_seconds = float(timeout[0])
        if isinstance(model, dict):
            if "model_type" not in model:
                raise InvalidArgument("the model config has no 'model_type' (e.g. 'llama')")
            request.config_json = json.dumps(model)
        elif isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            if os.path.isfile(path) and path.endswith(".json"):
                with open(path) as f:
                    request.config_json = f.read()
            else:
                # A local folder is sent as an absolute path; anything else is taken as a path on the
                # server's machine.
                request.model_path = os.path.abspath(path) if os.path.isdir(path) else path
        else:
            raise InvalidArgument("model must be a Hugging Face config dict or a folder path")
        if isinstance(kernels, str):
            request.kernels = kernels
        elif isinstance(kernels, dict):
            kernels = dict(kernels)
            request.kernels = kernels.pop("default", "fused")
            for op, choice in kernels.items():
                request.kernel_overrides[op] = choice
        else:
            raise InvalidArgument("kernels must be 'fused', 'reference' or a dict {op: choice}")
        _optimizer_message(request.optimizer, optimizer, "create_session")
        if devices is not None:
            request.devices.extend([devices] if isinstance(devices, int) else [int(d) for d in devices])
        return request

    @call
    def create_session(self, model, *, precision="bf16", kernels="fused", optimizer=None, seed=0,
                       devices=None, optimizer_in_backward=False, world=None, timeout=None):
        """A new session on the server.

        model: a Hugging Face config dict with "model_type" (random initialisation from `seed`), or the
          path of a local Hugging Face folder (config.json + safetensors), or a config.json file.
        precision: "fp32", "bf16" or "bf16_mixed".
        kernels: "fused", "reference", or {op: choice} with an optional "default" key.
        optimizer: AdamW defaults: lr, betas=(b1, b2) or beta1/beta2, eps, weight_decay, max_grad_norm.
        devices: CUDA device indices (None: device 0 when the server has one, else its CPU).
        optimizer_in_backward: apply AdamW to each parameter during backward, so that a train_step never
          holds all gradients (saves 2 bytes per parameter in bf16); same results, one device, no clipping.
        world: (world_size, rank, communicator_id[, collective_timeout_seconds]) makes this session one rank
          of a data-parallel session over several servers; every rank must be created at the same time
          (WorldSession does it). A rank waits that long for the others (default 300 s), then fails.
        """
        request = self._create_request(model, precision, kernels, optimizer, seed, devices, optimizer_in_backward,
                                       world)
        return self._call("CreateSession", request, lambda r: Session(self, SessionInfo.from_proto(r)), timeout)

    @call
    def session(self, session_id, *, timeout=None):
        """A handle on an existing session (e.g. one created by another client)."""
        return self._call("GetSession", pb.GetSessionRequest(session_id=session_id),
                          lambda r: Session(self, SessionInfo.from_proto(r)), timeout, True)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@with_async_variants
class Session:
    """A training session on the server. Use as a context manager to close it at the end.

    The calls made through one Session run on the server in the order they were made, `*_async` ones
    included: `f1 = s.forward_backward_async(big); f2 = s.optim_step_async()` steps on big's gradients."""

    def __init__(self, client, info):
        self._client = client
        self.info_at_creation = info
        self.id = info.session_id
        self._order_lock = threading.Lock()
        self._order_stream, self._order_number = os.urandom(16), 0

    @property
    def vocab_size(self):
        return self.info_at_creation.vocab_size

    def __repr__(self):
        i = self.info_at_creation
        return f"Session({self.id}, {i.model_family}, {i.precision}, {i.parameter_count} parameters)"

    # ---- requests ----

    def _batch_request(self, cls, input_ids, labels, loss_weights, objective=None, **fields):
        request = cls(session_id=self.id, **fields)
        batch, seq_len = _batch.fill_batch(request.batch, input_ids, labels, loss_weights)
        _batch.fill_objective(request.batch, batch, seq_len, **(objective or {}))
        return request

    def _train_request(self, input_ids, labels, loss_weights, request_id, settings, objective=None):
        request = self._batch_request(pb.TrainStepRequest, input_ids, labels, loss_weights, objective,
                                      request_id=request_id or uuid.uuid4().hex)
        _optimizer_message(request.optimizer, settings, "train_step")
        return request

    def _optim_request(self, request_id, settings):
        request = pb.OptimStepRequest(session_id=self.id, request_id=request_id or uuid.uuid4().hex)
        _optimizer_message(request.optimizer, settings, "optim_step")
        return request

    def _forward_convert(self, request):
        batch, seq_len = request.batch.batch, request.batch.seq_len
        want = request.return_logprobs

        def convert(r):
            logprobs = _batch.unflatten(r.logprobs, batch, seq_len) if want else None
            return ForwardResult(loss=r.loss, tokens=r.tokens, logprobs=logprobs, wall_seconds=r.wall_seconds,
                                 metrics=dict(r.metrics))
        return convert

    @staticmethod
    def _settings(lr, betas, beta1, beta2, eps, weight_decay, max_grad_norm):
        return dict(lr=lr, betas=betas, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay,
                    max_grad_norm=max_grad_norm)

    def _call(self, method, request, convert, timeout, idempotent=False):
        """The call, numbered in this handle's order of calls when its request has one (CallOrder): the
        server runs it after every call this handle sent before it, whatever their sizes."""
        on_error = None
        if "order" in request.DESCRIPTOR.fields_by_name:
            with self._order_lock:
                self._order_number += 1
                request.order.stream, request.order.number = self._order_stream, self._order_number
                stream = self._order_stream
            on_error = lambda error: self._order_broken(stream, error)  # noqa: E731
        return self._client._call(method, request, convert, timeout, idempotent, on_error=on_error)

    def _order_broken(self, stream, error):
        # ABORTED: a call before this one never reached the server, and the server refuses the rest of
        # that order. UNAVAILABLE, or a message over the server's size limit: this call may never have
        # reached it, and the calls after it would wait for it until they were refused. Either way the
        # calls made from now on start a new order.
        if isinstance(error, (Aborted, Unavailable)) or (isinstance(error, ResourceExhausted)
                                                        and "larger than max" in error.message):
            with self._order_lock:
                if self._order_stream == stream:
                    self._order_stream, self._order_number = os.urandom(16), 0

    # ---- steps ----

    # Every step takes the objective as keywords: loss_fn (tigon.v1.LossConfig lists them; default
    # "cross_entropy"), loss_fn_inputs (a dict: "logprobs" = the sampler's, "advantages",
    # "reference_logprobs", each [batch, seq_len]; "desirable", one flag per row for kto), loss_config (a
    # dict of the objective's settings, e.g. {"beta": 0.1}) and reference_session (a Session, or a session
    # id on the same server, whose log-probabilities dpo and kto take as the reference).

    @call
    def train_step(self, input_ids, labels=None, loss_weights=None, lr=None, *, betas=None, beta1=None,
                   beta2=None, eps=None, weight_decay=None, max_grad_norm=None, request_id=None,
                   loss_fn=None, loss_fn_inputs=None, loss_config=None, reference_session=None, timeout=None):
        """Forward, backward and an AdamW step on one batch; optimizer settings given here apply to this
        step only. labels default to input_ids shifted left by one (-100 = ignored)."""
        request = self._train_request(input_ids, labels, loss_weights, request_id,
                                      self._settings(lr, betas, beta1, beta2, eps, weight_decay, max_grad_norm),
                                      _objective(loss_fn, loss_fn_inputs, loss_config, reference_session))
        return self._call("TrainStep", request, StepResult.from_proto, timeout, True)

    @call
    def forward_backward(self, input_ids, labels=None, loss_weights=None, *, loss_fn=None, loss_fn_inputs=None,
                         loss_config=None, reference_session=None, timeout=None):
        """Forward and backward; the gradients add to those pending until the next optim_step."""
        request = self._batch_request(pb.ForwardBackwardRequest, input_ids, labels, loss_weights,
                                      _objective(loss_fn, loss_fn_inputs, loss_config, reference_session))
        return self._call("ForwardBackward", request, StepResult.from_proto, timeout)

    @call
    def forward_backward_custom(self, input_ids, loss, labels=None, *, timeout=None):
        """Forward and backward for any loss of the per-token log-probabilities: `loss(logprobs)` gets them
        as a [batch, seq_len] array (0 where the label is ignored). With torch installed it gets a float64
        tensor that requires grad and returns a scalar tensor (or (tensor, metrics dict)); otherwise it
        returns (loss value, dloss/dlogprobs as a [batch, seq_len] array). The server then applies that
        gradient through its fused head (loss_fn "linear"). Costs one more forward pass than a built-in
        objective. Returns the backward pass's StepResult with the loss (and metrics) of `loss`. Both calls
        take their places in the session's order now, so later calls run after them."""
        forward = self.forward_async(input_ids, labels, return_logprobs=True, timeout=timeout)
        request = self._batch_request(pb.ForwardBackwardRequest, input_ids, labels, None, dict(loss_fn="linear"))
        with self._order_lock:
            self._order_number += 1
            request.order.stream, request.order.number = self._order_stream, self._order_number
            stream = self._order_stream

        def finish():
            try:
                value, grad, metrics = _custom_loss_gradient(loss, forward.result(timeout).logprobs)
            except BaseException:
                # The numbered backward will never be sent: later calls start a new order instead of
                # waiting for it.
                with self._order_lock:
                    if self._order_stream == stream:
                        self._order_stream, self._order_number = os.urandom(16), 0
                raise
            request.batch.loss_weights.extend(-g for row in grad for g in row)
            result = self._client._call("ForwardBackward", request, StepResult.from_proto, timeout, False,
                                        on_error=lambda error: self._order_broken(stream, error)).run()
            return dataclasses.replace(result, loss=float(value), metrics=metrics)
        return _Deferred(finish)

    @call
    def optim_step(self, lr=None, *, betas=None, beta1=None, beta2=None, eps=None, weight_decay=None,
                   max_grad_norm=None, request_id=None, timeout=None):
        """AdamW over the pending gradients (FailedPrecondition when there are none)."""
        request = self._optim_request(request_id, self._settings(lr, betas, beta1, beta2, eps, weight_decay,
                                                                 max_grad_norm))
        return self._call("OptimStep", request, StepResult.from_proto, timeout, True)

    @call
    def forward(self, input_ids, labels=None, loss_weights=None, *, return_logprobs=False, loss_fn=None,
                loss_fn_inputs=None, loss_config=None, reference_session=None, timeout=None):
        """The batch's loss under its objective (and per-token log-probabilities with
        return_logprobs=True), no gradients."""
        request = self._batch_request(pb.ForwardRequest, input_ids, labels, loss_weights,
                                      _objective(loss_fn, loss_fn_inputs, loss_config, reference_session),
                                      return_logprobs=return_logprobs)
        return self._call("Forward", request, self._forward_convert(request), timeout, True)

    # ---- checkpoints ----

    @call
    def save(self, path, *, timeout=None):
        """Writes a checkpoint at `path` inside the server's --checkpoint-root."""
        request = pb.SaveCheckpointRequest(session_id=self.id, path=os.fspath(path))
        return self._call("SaveCheckpoint", request, _checkpoint_result, timeout)

    @call
    def load(self, path, *, timeout=None):
        """Loads weights, optimizer state and step from `path` inside the server's --checkpoint-root."""
        request = pb.LoadCheckpointRequest(session_id=self.id, path=os.fspath(path))
        return self._call("LoadCheckpoint", request, _checkpoint_result, timeout)

    # ---- memory savings ----

    @call
    def measure_savings(self, batch, seq_len, *, timeout=None):
        """Peak memory and time of one training step with fused and with reference kernels for this
        session's model and a [batch, seq_len] batch, measured on temporary sessions (this one is not
        changed)."""
        request = pb.MeasureSavingsRequest(session_id=self.id, batch=int(batch), seq_len=int(seq_len))
        return self._call("MeasureSavings", request, SavingsResult.from_proto, timeout)

    # ---- lifetime ----

    @call
    def info(self, *, timeout=None):
        """The session's info as of its last finished call (not ordered: it never waits for calls in flight)."""
        return self._call("GetSession", pb.GetSessionRequest(session_id=self.id), SessionInfo.from_proto, timeout,
                          True)

    @call
    def close(self, *, timeout=None):
        """Closes the session after the calls sent before it."""
        return self._call("CloseSession", pb.CloseSessionRequest(session_id=self.id), lambda r: None, timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for _ in range(2):
            try:
                self.close()
            except Aborted:
                continue  # refused behind a call that never arrived; the handle's next order closes it
            except TigonError:
                pass  # already closed, or the server is gone: nothing left to release
            return


def _objective(loss_fn, loss_fn_inputs, loss_config, reference_session):
    return dict(loss_fn=loss_fn, loss_fn_inputs=loss_fn_inputs, loss_config=loss_config,
                reference_session=reference_session)


def _custom_loss_gradient(loss, logprobs):
    """(loss value, dloss/dlogprobs as lists of rows, metrics) of a forward_backward_custom loss."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        lp = torch.tensor(logprobs.tolist() if hasattr(logprobs, "tolist") else logprobs, dtype=torch.float64,
                          requires_grad=True)
        out = loss(lp)
        value, metrics = (out[0], dict(out[1])) if isinstance(out, tuple) else (out, {})
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise InvalidArgument(f"the custom loss returned a tensor of {value.numel()} values, not a scalar")
            (grad,) = torch.autograd.grad(value, lp, allow_unused=True)
            grad = torch.zeros_like(lp) if grad is None else grad
            return float(value.detach()), grad.tolist(), metrics
        out = (value, metrics)
    else:
        out = loss(logprobs)
    if not isinstance(out, tuple) or len(out) != 2:
        raise InvalidArgument("without torch, the custom loss must return (loss value, dloss/dlogprobs)")
    value, grad = out
    rows = grad.tolist() if hasattr(grad, "tolist") else [list(row) for row in grad]
    return float(value), rows, {}


def _checkpoint_result(r):
    return CheckpointResult(path=r.path, step=r.step, wall_seconds=r.wall_seconds)
