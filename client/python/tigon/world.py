"""Data parallelism over several servers: one session spread over N tigon-servers, one CUDA device each.

    clients = [tigon.connect(address) for address in ("host-a:50051", "host-b:50051")]
    with tigon.WorldSession.create(clients, config, precision="bf16") as world:
        for batch in batches:                 # [rows, seq_len], rows >= the number of servers
            result = world.train_step(batch)  # loss, tokens and grad norm of the whole batch

Rank 0's server makes the communicator id (NewCommunicatorId) and every server creates its rank at the
same time; the ranks then sum their gradients with NCCL, server to server. Each call is sent to every rank
at once, each with its share of the rows (split as evenly as possible, in order), and returns rank 0's
result. The ranks' weights stay identical; save and load act on every rank. Every method also exists as
`*_async`, returning a Future; the ranks' calls are sent when it is called, so calls made one after
another run on every rank in that order.
"""
import threading

from ._batch import _rows_from_lists
from ._calls import _Deferred, _Gather, call, with_async_variants
from .errors import InvalidArgument, TigonError

try:
    import numpy as np
except ImportError:  # numpy is optional
    np = None


def _row_shares(rows, ranks):
    """[(first, count)] per rank: the rows split as evenly as possible, in order."""
    base, extra = divmod(rows, ranks)
    shares, first = [], 0
    for r in range(ranks):
        count = base + (1 if r < extra else 0)
        shares.append((first, count))
        first += count
    return shares


def _as_rows(values, name):
    """values as rows: a 2-D numpy array as it is, a 1-D one or a flat list as one row, a list of rows
    as lists (ragged or empty ones refused, as Session's calls refuse them)."""
    if np is not None and isinstance(values, np.ndarray):
        return values.reshape(1, -1) if values.ndim == 1 else values
    return _rows_from_lists(values, name)[0]


def _gather(futures, stop_at_first_error=False):
    """Waits for every future (a rank's call must not be left running unseen); returns the results and
    the first error, or None. With stop_at_first_error, the calls still running when one fails are
    cancelled (their servers drop what they were creating) instead of being waited for."""
    cancelled = set()
    if stop_at_first_error:
        failed = threading.Event()
        for future in futures:
            future.add_done_callback(lambda f: failed.set() if f.exception() is not None else None)
        while not failed.wait(0.05) and not all(f.done() for f in futures):
            pass
        if failed.is_set():
            cancelled = {i for i, future in enumerate(futures) if not future.done() and future.cancel()}
    results, errors = [], []
    for i, future in enumerate(futures):
        try:
            results.append(future.result())
        except TigonError as error:
            errors.append((i in cancelled, error))  # the cause first, then what was cancelled because of it
    errors.sort(key=lambda e: e[0])
    return results, errors[0][1] if errors else None


def _check_ids(rows, vocab_size, name, allow_ignored):
    """Ids outside [0, vocab_size) (labels may also be -100) are refused here: a server that refused its
    rows alone would leave the other ranks waiting for the collective timeout."""
    if np is not None:
        array = np.asarray(rows)
        bad = (array < 0) | (array >= vocab_size)
        if allow_ignored:
            bad &= array != -100
        if bad.any():
            raise InvalidArgument(f"{name} holds {array[bad].flat[0]}, outside the vocabulary [0, {vocab_size})")
        return
    for row in rows:
        for value in row:
            if not (0 <= value < vocab_size or (allow_ignored and value == -100)):
                raise InvalidArgument(f"{name} holds {value}, outside the vocabulary [0, {vocab_size})")


def _first_result(futures):
    """Rank 0's result once every rank has answered; the first error if any failed."""
    results, first_error = _gather(futures)
    if first_error is not None:
        raise first_error
    return results[0]


def _every_result(futures):
    results, first_error = _gather(futures)
    if first_error is not None:
        raise first_error
    return results


def _nothing(futures):
    _every_result(futures)


@with_async_variants
class WorldSession:
    """One data-parallel session over several servers. Create it with WorldSession.create."""

    def __init__(self, sessions):
        self.sessions = list(sessions)

    @classmethod
    @call
    def create(cls, clients, model, *, devices=None, collective_timeout=None, timeout=None, **session_options):
        """Creates rank r of the session on clients[r] (devices: one CUDA index per server, or None for
        device 0 everywhere); the other options are create_session's. collective_timeout: seconds a rank
        waits for the others, at creation and in every step, before the session fails (default 300). If
        any rank fails, the ranks that were created are closed and the first error is raised."""
        return _Deferred(lambda: cls._create(clients, model, devices, collective_timeout, timeout, session_options))

    @classmethod
    def _create(cls, clients, model, devices, collective_timeout, timeout, session_options):
        clients = list(clients)
        if len(clients) < 2:
            raise InvalidArgument("a session over several servers needs at least two clients")
        if devices is not None and len(devices) != len(clients):
            raise InvalidArgument(f"devices has {len(devices)} entries for {len(clients)} servers")
        communicator_id = clients[0].new_communicator_id(timeout=timeout)
        futures = [client.create_session_async(
            model, devices=None if devices is None else [devices[r]],
            world=(len(clients), r, communicator_id, collective_timeout), timeout=timeout, **session_options)
            for r, client in enumerate(clients)]
        sessions, first_error = _gather(futures, stop_at_first_error=True)
        if first_error is not None:
            for session in sessions:
                try:
                    session.close()
                except TigonError:
                    pass
            raise first_error
        return cls(sessions)

    @property
    def world_size(self):
        return len(self.sessions)

    def _on_every_rank(self, method, input_ids, labels, loss_weights, **kwargs):
        # Everything a server would refuse for one rank's rows alone is refused here, before any call.
        given = {name: _as_rows(values, name) for name, values in
                 (("input_ids", input_ids), ("labels", labels), ("loss_weights", loss_weights)) if values is not None}
        rows = len(given["input_ids"])
        if rows < self.world_size:
            raise InvalidArgument(f"a batch of {rows} rows cannot be shared by {self.world_size} ranks: "
                                  "each needs at least one row")
        for name, values in given.items():
            if len(values) != rows:
                raise InvalidArgument(f"{name} has {len(values)} rows, input_ids {rows}")
        vocab_size = self.sessions[0].vocab_size
        _check_ids(given["input_ids"], vocab_size, "input_ids", allow_ignored=False)
        if "labels" in given:
            _check_ids(given["labels"], vocab_size, "labels", allow_ignored=True)
        futures = []
        for session, (first, count) in zip(self.sessions, _row_shares(rows, self.world_size)):
            share = {name: values[first:first + count] for name, values in given.items()}
            futures.append(getattr(session, method)(share["input_ids"], share.get("labels"), share.get("loss_weights"),
                                                    **kwargs))
        return _Gather(futures, _first_result)

    @call
    def train_step(self, input_ids, labels=None, loss_weights=None, **settings):
        """Session.train_step over the whole batch; the settings (lr, ...) go to every rank."""
        return self._on_every_rank("train_step_async", input_ids, labels, loss_weights, **settings)

    @call
    def forward_backward(self, input_ids, labels=None, loss_weights=None, *, timeout=None):
        return self._on_every_rank("forward_backward_async", input_ids, labels, loss_weights, timeout=timeout)

    @call
    def optim_step(self, **settings):
        return _Gather([session.optim_step_async(**settings) for session in self.sessions], _first_result)

    @call
    def save(self, path, *, timeout=None):
        """Every rank saves to `path` under its own server's --checkpoint-root (the weights are the same
        on every rank), so that load works whether or not the servers share a file system."""
        return _Gather([session.save_async(path, timeout=timeout) for session in self.sessions], _first_result)

    @call
    def load(self, path, *, timeout=None):
        """Every rank loads `path` under its own server's --checkpoint-root, as save wrote it."""
        return _Gather([session.load_async(path, timeout=timeout) for session in self.sessions], _first_result)

    @call
    def info(self, *, timeout=None):
        """Every rank's SessionInfo."""
        return _Gather([session.info_async(timeout=timeout) for session in self.sessions], _every_result)

    @call
    def close(self, *, timeout=None):
        return _Gather([session.close_async(timeout=timeout) for session in self.sessions], _nothing)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
