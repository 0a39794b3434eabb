"""Packing of token batches into the wire's Batch message: row-major [batch, seq_len].

Accepts numpy arrays or (nested) Python lists; a 1-D sequence is one row. Shapes are checked here so
that a mistake is reported before anything is sent; value ranges (the vocabulary) are checked by the
server, which knows the model.
"""
from .errors import InvalidArgument

try:
    import numpy as np
except ImportError:  # numpy is optional
    np = None

_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def _rows_from_lists(values, name):
    if len(values) > 0 and not isinstance(values[0], (list, tuple)):
        values = [values]
    rows = [list(row) for row in values]
    if not rows or not rows[0]:
        raise InvalidArgument(f"{name} is empty")
    width = len(rows[0])
    for i, row in enumerate(rows):
        if len(row) != width:
            raise InvalidArgument(f"{name} is ragged: row 0 has {width} values, row {i} has {len(row)}")
    return rows, len(rows), width


def _flatten(values, name, integer):
    """Returns (flat list, batch, seq_len)."""
    if np is not None and isinstance(values, np.ndarray):
        array = values
        if array.ndim == 1:
            array = array.reshape(1, -1)
        if array.ndim != 2:
            raise InvalidArgument(f"{name} must have 1 or 2 dimensions, not {array.ndim}")
        if array.size == 0:
            raise InvalidArgument(f"{name} is empty")
        if integer:
            if array.dtype.kind not in "iu":
                raise InvalidArgument(f"{name} must hold integers, not {array.dtype}")
            if array.dtype.itemsize > 4 or array.dtype.kind == "u":
                lo, hi = int(array.min()), int(array.max())
                if lo < _INT32_MIN or hi > _INT32_MAX:
                    raise InvalidArgument(f"{name} has values outside int32")
            flat = array.astype(np.int32, copy=False).ravel().tolist()
        else:
            if array.dtype.kind not in "fiu":
                raise InvalidArgument(f"{name} must hold numbers, not {array.dtype}")
            flat = array.astype(np.float32, copy=False).ravel().tolist()
        return flat, array.shape[0], array.shape[1]
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise InvalidArgument(f"{name} must be a list or a numpy array")
    rows, batch, seq_len = _rows_from_lists(values, name)
    flat = [v for row in rows for v in row]
    if integer:
        for v in flat:
            if isinstance(v, bool) or not isinstance(v, int) and not (np is not None and isinstance(v, np.integer)):
                raise InvalidArgument(f"{name} must hold integers, not {type(v).__name__}")
            if v < _INT32_MIN or v > _INT32_MAX:
                raise InvalidArgument(f"{name} has values outside int32")
        flat = [int(v) for v in flat]
    else:
        flat = [float(v) for v in flat]
    return flat, batch, seq_len


def fill_batch(message, input_ids, labels=None, loss_weights=None):
    """Fills a tigon.v1.Batch message; returns (batch, seq_len)."""
    ids, batch, seq_len = _flatten(input_ids, "input_ids", integer=True)
    message.batch = batch
    message.seq_len = seq_len
    message.input_ids.extend(ids)
    for name, values, integer, field in (("labels", labels, True, message.labels),
                                         ("loss_weights", loss_weights, False, message.loss_weights)):
        if values is None:
            continue
        flat, b, s = _flatten(values, name, integer=integer)
        if (b, s) != (batch, seq_len):
            raise InvalidArgument(f"{name} has shape [{b}, {s}], input_ids has [{batch}, {seq_len}]")
        field.extend(flat)
    return batch, seq_len


# loss_fn_inputs' keys -> the Batch message's per-position fields (Tinker's name for the sampler's).
_OBJECTIVE_INPUTS = {"logprobs": "sampler_logprobs", "sampler_logprobs": "sampler_logprobs",
                     "advantages": "advantages", "reference_logprobs": "reference_logprobs"}
_LOSS_CONFIG_FIELDS = ("clip_low_threshold", "clip_high_threshold", "beta", "gamma", "label_smoothing", "z_loss",
                       "cpo_alpha", "desirable_weight", "undesirable_weight")


def fill_objective(message, batch, seq_len, loss_fn=None, loss_fn_inputs=None, loss_config=None,
                   reference_session=None):
    """The objective's part of a tigon.v1.Batch message: loss_fn, its per-position inputs ([batch,
    seq_len] like input_ids; "desirable": one flag per row), its settings, and where reference
    log-probabilities come from (a Session or a session id on the same server)."""
    if loss_fn is not None:
        message.loss_fn = str(loss_fn)
    for key, values in (loss_fn_inputs or {}).items():
        if key == "desirable":
            flags = values.tolist() if np is not None and isinstance(values, np.ndarray) else list(values)
            if len(flags) != batch:
                raise InvalidArgument(f"desirable has {len(flags)} flags for {batch} rows")
            message.desirable.extend(bool(f) for f in flags)
            continue
        if key not in _OBJECTIVE_INPUTS:
            known = ", ".join(sorted(set(_OBJECTIVE_INPUTS) | {"desirable"}))
            raise InvalidArgument(f"loss_fn_inputs has an unknown key {key!r}; known: {known}")
        flat, b, s = _flatten(values, key, integer=False)
        if (b, s) != (batch, seq_len):
            raise InvalidArgument(f"{key} has shape [{b}, {s}], input_ids has [{batch}, {seq_len}]")
        getattr(message, _OBJECTIVE_INPUTS[key]).extend(flat)
    for key, value in (loss_config or {}).items():
        if key == "loss_type":
            message.loss_config.loss_type = str(value)
        elif key in _LOSS_CONFIG_FIELDS:
            setattr(message.loss_config, key, float(value))
        else:
            raise InvalidArgument(f"loss_config has an unknown key {key!r}; known: "
                                  + ", ".join(_LOSS_CONFIG_FIELDS + ("loss_type",)))
    if reference_session is not None:
        message.reference_session_id = getattr(reference_session, "id", reference_session)


def unflatten(values, batch, seq_len):
    """[batch, seq_len] numpy array (or list of lists without numpy) from a flat repeated field."""
    if np is not None:
        return np.asarray(values, dtype=np.float32).reshape(batch, seq_len)
    flat = list(values)
    return [flat[r * seq_len:(r + 1) * seq_len] for r in range(batch)]
