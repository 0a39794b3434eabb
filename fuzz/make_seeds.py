#!/usr/bin/python3
"""Writes the hand-made seed inputs of fuzz/corpus/<target>/ (valid examples and edge cases).

Run with /usr/bin/python3 from the repository root; the files it writes are committed, and libFuzzer
adds the inputs it finds interesting next to them when fuzz/run.sh is given --merge.
"""
import json
import os
import struct
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))
from tigon.v1 import trainer_pb2  # noqa: E402


def write(target, name, data):
    folder = os.path.join(ROOT, "fuzz", "corpus", target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


# ---- safetensors: 8-byte little-endian header length, JSON header, data ------------------------
def safetensors(header, data=b"", length=None, pad=True):
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


ST = "fuzz_safetensors"
write(ST, "valid_two_tensors", safetensors(
    {"__metadata__": {"format": "pt"}, "a": entry("F32", [2, 2], 0, 16), "b": entry("BF16", [3], 16, 22)},
    bytes(range(22))))
write(ST, "valid_every_dtype", safetensors(
    {name: entry(name, [2], i * 16, i * 16 + 2 * size) for i, (name, size) in enumerate(
        [("F64", 8), ("F32", 4), ("F16", 2), ("BF16", 2), ("I64", 8), ("I32", 4), ("I16", 2), ("I8", 1),
         ("U8", 1), ("BOOL", 1)])}, bytes(160)))
write(ST, "valid_empty_and_scalar", safetensors(
    {"empty": entry("F32", [0, 4], 0, 0), "scalar": entry("I64", [], 0, 8)}, bytes(8)))
write(ST, "overlapping_offsets", safetensors(
    {"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12)))
write(ST, "offsets_past_end", safetensors({"a": entry("F32", [4], 0, 16)}, bytes(8)))
write(ST, "offsets_reversed", safetensors({"a": entry("U8", [0], 8, 4)}, bytes(8)))
write(ST, "shape_product_overflows_int64", safetensors(
    {"a": entry("F32", [4294967296, 4294967296, 2], 0, 0)}))
write(ST, "shape_zero_times_huge", safetensors(
    {"a": entry("F32", [0, 9223372036854775807, 9223372036854775807], 0, 0)}))
write(ST, "negative_dim", safetensors({"a": entry("F32", [-1, 2], 0, 8)}, bytes(8)))
write(ST, "dtype_size_mismatch", safetensors({"a": entry("F16", [4], 0, 16)}, bytes(16)))
write(ST, "unknown_dtype", safetensors({"a": entry("F8_E4M3", [4], 0, 4)}, bytes(4)))
write(ST, "header_length_past_end", safetensors({"a": entry("U8", [1], 0, 1)}, b"x", length=1 << 40))
write(ST, "header_length_huge", struct.pack("<Q", 0xFFFFFFFFFFFFFFFF) + b"{}")
write(ST, "truncated_length", b"\x10\x00\x00")
write(ST, "not_an_object", safetensors([1, 2, 3]))
write(ST, "entry_wrong_types", safetensors({"a": {"dtype": 7, "shape": "x", "data_offsets": {}}}))
write(ST, "float_offsets", safetensors({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0.0, 1.5]}}, b"x"))

# ---- config.json ---------------------------------------------------------------------------------
CF = "fuzz_config"
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
for family in sorted(os.listdir(FIXTURES)):  # one fixture per registered family (models/families/)
    path = os.path.join(FIXTURES, family, "config.json")
    if os.path.exists(path):
        with open(path, "rb") as f:
            write(CF, "fixture_" + family, f.read())
base = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
write(CF, "llama3_rope", json.dumps(dict(base, rope_scaling={
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192})))
write(CF, "qwen2_sliding_layers", json.dumps(dict(base, model_type="qwen2", use_sliding_window=True,
                                                  sliding_window=16, max_window_layers=1)))
write(CF, "qwen2_layer_types", json.dumps(dict(base, model_type="qwen2", use_sliding_window=True, sliding_window=16,
                                               layer_types=["full_attention", "sliding_attention"])))
write(CF, "phi3_partial_rotary", json.dumps(dict(base, model_type="phi3", partial_rotary_factor=0.5)))
write(CF, "v5_rope_parameters", json.dumps(dict(base, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                      "rope_theta": 500000.0})))
write(CF, "absurd_sizes", json.dumps(dict(base, num_hidden_layers=9000000000000000, vocab_size=2 ** 63)))
write(CF, "wrong_types", json.dumps(dict(base, hidden_size="64", rope_scaling=[1], tie_word_embeddings=1)))
write(CF, "float_sizes", json.dumps(dict(base, hidden_size=64.0, num_hidden_layers=2.5)))

# ---- requests: one selector byte (bit 0: TrainStep, bits 1-2: batch-token limit, bits 3-4: device
# count; see request_fuzz.cpp), then the serialized message -----------------------------------------
RQ = "fuzz_request"
create = trainer_pb2.CreateSessionRequest(config_json=json.dumps(base), precision="bf16_mixed", kernels="fused",
                                          seed=7, devices=[0, 1])
create.kernel_overrides["rms_norm"] = "reference"
create.optimizer.lr = 1e-3
create.optimizer.max_grad_norm = 1.0
write(RQ, "create_config_two_devices", bytes([2 << 3]) + create.SerializeToString())
write(RQ, "create_model_path", bytes([0]) + trainer_pb2.CreateSessionRequest(
    model_path="/nonexistent/model").SerializeToString())
write(RQ, "create_bad_optimizer", bytes([8]) + trainer_pb2.CreateSessionRequest(
    config_json='{"model_type":"llama"}', optimizer=trainer_pb2.OptimizerSettings(
        beta1=1.0, eps=float("nan"))).SerializeToString())
batch = trainer_pb2.Batch(batch=2, seq_len=4, input_ids=[1, 2, 3, 4, 5, 6, 7, 8],
                          labels=[2, 3, 4, -100, 6, 7, 8, -100], loss_weights=[1, 1, 0.5, 0, 1, 1, 1, 0])
write(RQ, "train_valid", bytes([1]) + trainer_pb2.TrainStepRequest(
    session_id="s", batch=batch, optimizer=trainer_pb2.OptimizerSettings(lr=1e-4),
    request_id="r1").SerializeToString())
write(RQ, "train_default_labels", bytes([1]) + trainer_pb2.TrainStepRequest(
    batch=trainer_pb2.Batch(batch=1, seq_len=3, input_ids=[1, 2, 3])).SerializeToString())
write(RQ, "train_huge_shape_unlimited", bytes([1 | (2 << 1)]) + trainer_pb2.TrainStepRequest(
    batch=trainer_pb2.Batch(batch=1 << 33, seq_len=1 << 31, input_ids=[1])).SerializeToString())
write(RQ, "train_ragged", bytes([1]) + trainer_pb2.TrainStepRequest(
    batch=trainer_pb2.Batch(batch=2, seq_len=4, input_ids=[1, 2, 3])).SerializeToString())
write(RQ, "train_nan_weight", bytes([1]) + trainer_pb2.TrainStepRequest(batch=trainer_pb2.Batch(
    batch=1, seq_len=2, input_ids=[1, 2], loss_weights=[float("nan"), 1])).SerializeToString())

# fuzz_checkpoint_path: a selector byte (bit 0: admin, else the user bob; bits 1-2: Locate, OpenForLoad,
# OpenForSave, LocateFolder), then the path. The fixture's tree: root/{bob/{run/step-1, latest -> run/step-1,
# up -> ../alice, abs -> root/alice/private, out -> outside}, alice/private, escape -> outside, mallory -> alice}.
CP = "fuzz_checkpoint_path"
for call, selector in (("locate", 0), ("load", 2), ("save", 4), ("model", 6)):
    for name, path in (("plain", "run/step-2"), ("dotdot_other", "../alice/private"), ("link_inside", "latest"),
                       ("link_up", "up/private"), ("link_abs", "abs"), ("link_out", "out/x"),
                       ("absolute_other", "/tmp/root/alice/private"), ("temporary", "run/a.tmp-1-2"),
                       ("control", "run/a\nb\x1b[2J"), ("empty", "")):
        write(CP, f"{call}_user_{name}", bytes([selector]) + path.encode())
    write(CP, f"{call}_admin_other", bytes([selector | 1]) + b"alice/private")
    write(CP, f"{call}_admin_escape", bytes([selector | 1]) + b"escape/x")
