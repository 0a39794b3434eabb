"""Errors raised by the client: one class per gRPC status code, each carrying the server's message."""
import grpc


class TigonError(Exception):
    """A call failed. `code` is the grpc.StatusCode, `message` what the server said was wrong."""

    code = grpc.StatusCode.UNKNOWN

    def __init__(self, message, code=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def __str__(self):
        return f"{self.code.name}: {self.message}"


class InvalidArgument(TigonError, ValueError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(TigonError, LookupError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(TigonError):
    """A server limit, the message size, or device memory; the message says which."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unauthenticated(TigonError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(TigonError):
    code = grpc.StatusCode.PERMISSION_DENIED


class FailedPrecondition(TigonError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class DeadlineExceeded(TigonError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unavailable(TigonError, ConnectionError):
    code = grpc.StatusCode.UNAVAILABLE


class Cancelled(TigonError):
    code = grpc.StatusCode.CANCELLED


class Aborted(TigonError):
    """A call numbered after one that never reached the server: refused unrun, so that none runs out of
    order (the session's later calls start a new order)."""
    code = grpc.StatusCode.ABORTED


class Internal(TigonError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE = {cls.code: cls for cls in (InvalidArgument, NotFound, ResourceExhausted, Unauthenticated,
                                      PermissionDenied, FailedPrecondition, DeadlineExceeded,
                                      Unavailable, Cancelled, Aborted, Internal)}


def from_rpc_error(error):
    """The TigonError subclass for a grpc.RpcError (TigonError itself for codes without one)."""
    code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
    message = error.details() if hasattr(error, "details") else str(error)
    cls = _BY_CODE.get(code, TigonError)
    return cls(message or "", code)
