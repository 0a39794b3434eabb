"""One definition per call, two ways to make it: each public call is written once, as a method that prepares
the call and returns it unsent (a `_Call`, `_Gather` or `_Deferred`); `@with_async_variants` turns every
such method `name` into `name(...)`, which makes the call and waits for its result, and `name_async(...)`,
which makes it and returns a `Future`. Whatever must happen in submission order (sending an RPC, taking a
session's next call number) happens when the call is prepared, in the caller's thread, for both."""
import concurrent.futures
import functools
import threading

import grpc

from .errors import Cancelled, TigonError, from_rpc_error

_pool = None
_pool_lock = threading.Lock()


def _workers():
    """Threads that wait on calls made of several RPCs (the RPCs themselves are sent by gRPC)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="tigon-call")
        return _pool


class Future:
    """The result of an `*_async` call: `result(timeout=None)` returns the typed result or raises the
    TigonError; also `done()`, `cancel()`, `exception()`, `add_done_callback(fn)`."""

    def __init__(self, inner, convert=None, on_error=None):
        self._future = inner  # a grpc future, or a concurrent.futures.Future of a finished result
        self._convert = convert
        self._on_error = on_error

    def result(self, timeout=None):
        try:
            response = self._future.result(timeout=timeout)
        except TigonError:
            raise
        except (grpc.FutureTimeoutError, concurrent.futures.TimeoutError):
            raise TimeoutError("the call has not finished yet") from None
        except (grpc.FutureCancelledError, concurrent.futures.CancelledError):
            raise Cancelled("the call was cancelled", grpc.StatusCode.CANCELLED) from None
        except grpc.RpcError as error:
            error = from_rpc_error(error)
            if self._on_error is not None:
                self._on_error(error)
            raise error from None
        return response if self._convert is None else self._convert(response)

    def exception(self, timeout=None):
        try:
            self.result(timeout)
        except TigonError as error:
            return error
        return None

    def done(self):
        return self._future.done()

    def cancel(self):
        return self._future.cancel()

    def cancelled(self):
        return self._future.cancelled()

    def add_done_callback(self, fn):
        self._future.add_done_callback(lambda _: fn(self))


class _Call:
    """One RPC, prepared: `run()` sends it and waits (retrying on UNAVAILABLE when `idempotent` and the
    client has retries), `submit()` sends it and returns a Future. `on_error(error)` sees its failures."""

    def __init__(self, client, method, request, convert, timeout=None, idempotent=False, on_error=None, rpc=None):
        self.client, self.method, self.request, self.convert = client, method, request, convert
        self.timeout, self.idempotent, self.on_error, self.rpc = timeout, idempotent, on_error, rpc

    def run(self):
        return self.client._run(self)

    def submit(self):
        return self.client._submit(self)


class _Gather:
    """Calls already sent (one per rank of a WorldSession); `combine(futures)` waits for them and makes the
    result. `submit()` does that waiting on a worker thread."""

    def __init__(self, futures, combine):
        self.futures, self.combine = futures, combine

    def run(self):
        return self.combine(self.futures)

    def submit(self):
        return Future(_workers().submit(self.combine, self.futures))


class _Deferred:
    """A call made of others one after another (WorldSession.create): `submit()` runs it on a worker thread."""

    def __init__(self, fn):
        self.fn = fn

    def run(self):
        return self.fn()

    def submit(self):
        return Future(_workers().submit(self.fn))


def call(prepare):
    """Marks a method that prepares a call (see with_async_variants)."""
    prepare._tigon_call = True
    return prepare


def _variants(name, prepare):
    @functools.wraps(prepare)
    def blocking(*args, **kwargs):
        return prepare(*args, **kwargs).run()

    @functools.wraps(prepare)
    def submitting(*args, **kwargs):
        return prepare(*args, **kwargs).submit()

    submitting.__name__ = name + "_async"
    submitting.__qualname__ = prepare.__qualname__ + "_async"
    submitting.__doc__ = f"`{name}` without waiting: returns a tigon.Future of its result."
    return blocking, submitting


def with_async_variants(cls):
    """Replaces each @call method `name` of `cls` by `name` (waits) and adds `name_async` (a Future)."""
    for name, member in list(vars(cls).items()):
        is_classmethod = isinstance(member, classmethod)
        prepare = member.__func__ if is_classmethod else member
        if not getattr(prepare, "_tigon_call", False):
            continue
        blocking, submitting = _variants(name, prepare)
        wrap = classmethod if is_classmethod else (lambda f: f)
        setattr(cls, name, wrap(blocking))
        setattr(cls, name + "_async", wrap(submitting))
    return cls
