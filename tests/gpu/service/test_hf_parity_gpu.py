"""Parity with Hugging Face at real widths, through the service on the GPU: a randomly initialised
Llama-3-8B-shaped model cut to two layers (hidden 4096, 32 heads / 8 KV heads, intermediate 14336,
vocabulary 128256), fp32, fused kernels. Tigon's loss, per-token log-probabilities and gradients must
match `transformers`' LlamaForCausalLM loaded from Tigon's own step-0 checkpoint, on the same batch.

The service exposes no gradients, so they are read from one AdamW step with lr = eps = 1e4 and no weight
decay: at step 1 Adam's update is -lr * g / (|g| + eps), i.e. -g / (1 + |g| / 1e4), which is -g to a
relative 1e-4 for gradients far below 1 (these are about 1e-3). The fp32 weight difference then carries
the gradient to about 2e-6 relative (an ulp of the weights over the size of the update).
"""
import os

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from conftest import ServerProcess

CONFIG = dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
              num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
              max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=False,
              initializer_range=0.02)
LR = EPS = 1e4


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_parity")
    server = ServerProcess(str(tmp), "--max-message-bytes=268435456", f"--checkpoint-root={tmp / 'ckpt'}",
                           name="hf_parity")
    server.root = str(tmp / "ckpt")
    assert server.client().server_info().devices, "this test needs a CUDA device"
    yield server
    server.stop()


def test_loss_logprobs_and_gradients_match_transformers(gpu_server):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(3)
    batch = rng.integers(0, CONFIG["vocab_size"], size=(2, 256), dtype=np.int64)
    client = gpu_server.client()
    with client.create_session(CONFIG, precision="fp32", kernels="fused", seed=11,
                               optimizer=dict(lr=LR, eps=EPS, weight_decay=0.0)) as session:
        session.save("step0")
        forward = session.forward(batch, return_logprobs=True)
        session.train_step(batch)
        session.save("step1")
    w0 = load_file(os.path.join(gpu_server.root, "step0", "model.safetensors"))
    w1 = load_file(os.path.join(gpu_server.root, "step1", "model.safetensors"))

    hf_config = LlamaConfig(**{k: v for k, v in CONFIG.items() if k != "model_type"})
    with torch.device("cuda"):  # initialised on the GPU (fast), then overwritten with Tigon's weights
        model = LlamaForCausalLM(hf_config).to(torch.float32)
    missing, unexpected = model.load_state_dict(w0, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    ids = torch.from_numpy(batch).cuda()
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()

    # Loss: the mean over the 2 x 255 target tokens, both sides.
    assert abs(forward.loss - out.loss.item()) <= 1e-5 * abs(out.loss.item()), (forward.loss, out.loss.item())
    logp = torch.log_softmax(out.logits.double(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    ours = np.asarray(forward.logprobs, dtype=np.float64).reshape(2, 256)[:, :-1]
    assert np.abs(ours - logp.detach().cpu().numpy()).max() <= 1e-4

    grads = dict(model.named_parameters())
    for name, before in w0.items():
        g = grads[name].grad.double().cpu()
        recovered = -(w1[name].double() - before.double())
        rel = (recovered - g).norm() / g.norm()
        assert rel <= 2e-3, f"{name}: gradient read through the service differs by {rel:.2e} (relative norm)"
