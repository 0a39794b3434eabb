"""Post-training objectives through the service (loss_fn): each reported loss against its formula
computed here in float64 from the session's own log-probabilities, the objectives' figures, reference
log-probabilities from another session on the same server, custom losses, and bad input refused with
nothing applied."""
import math

import numpy as np
import pytest

import tigon
from conftest import TINY_LLAMA


def _batch(rows=4, seq_len=12, seed=0, prompt=3):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 256, size=(rows, seq_len), dtype=np.int64)
    labels = np.roll(ids, -1, axis=1)
    labels[:, -1] = -100
    labels[:, :prompt] = -100  # a prompt that carries no loss
    return ids, labels


def _session(client, seed=3, lr=1e-3):
    return client.create_session(TINY_LLAMA, precision="fp32", optimizer=dict(lr=lr), seed=seed)


def test_ppo_loss_and_figures_follow_the_formula_and_training_moves_the_ratio(shared_server):
    client = shared_server.client()
    ids, labels = _batch()
    valid = labels != -100
    rng = np.random.default_rng(1)
    with _session(client) as session:
        lp = session.forward(ids, labels=labels, return_logprobs=True).logprobs.astype(np.float64)
        sampler = lp + 0.3 * rng.standard_normal(lp.shape)
        advantages = rng.standard_normal(lp.shape)
        inputs = {"logprobs": sampler, "advantages": advantages}
        ratio = np.exp(lp - sampler)
        objective = np.minimum(ratio * advantages, np.clip(ratio, 0.8, 1.2) * advantages)
        expected = -objective[valid].mean()
        clipped = (np.clip(ratio, 0.8, 1.2) * advantages < ratio * advantages)[valid].mean()

        evaluated = session.forward(ids, labels=labels, loss_fn="ppo", loss_fn_inputs=inputs)
        assert evaluated.loss == pytest.approx(expected, rel=1e-4, abs=1e-6)
        result = session.train_step(ids, labels=labels, loss_fn="ppo", loss_fn_inputs=inputs)
        assert result.loss == pytest.approx(expected, rel=1e-4, abs=1e-6)
        assert result.tokens == int(valid.sum()) and result.step == 1
        assert result.metrics["clip_fraction"] == pytest.approx(clipped, abs=1e-6)
        assert 0 < result.metrics["clip_fraction"] < 1
        assert result.metrics["ratio_mean"] == pytest.approx(ratio[valid].mean(), rel=1e-4)
        # A few steps on the same data raise the surrogate objective (the loss falls).
        for _ in range(10):
            last = session.train_step(ids, labels=labels, loss_fn="ppo", loss_fn_inputs=inputs, lr=5e-3)
        assert last.loss < result.loss


def test_dpo_with_a_reference_session_learns_to_prefer_the_chosen_rows(shared_server):
    client = shared_server.client()
    ids, labels = _batch(rows=4, seed=5)
    with _session(client, seed=9) as policy, _session(client, seed=9) as reference:
        first = policy.forward(ids, labels=labels, loss_fn="dpo", reference_session=reference)
        # Policy and reference are the same model: every margin is 0 and the loss is log 2.
        assert first.loss == pytest.approx(math.log(2), rel=1e-5)
        assert first.metrics["reward_margin"] == pytest.approx(0, abs=1e-5)
        results = [policy.train_step(ids, labels=labels, loss_fn="dpo", loss_config={"beta": 0.5},
                                     reference_session=reference, lr=3e-3) for _ in range(15)]
        assert results[-1].loss < 0.5 * results[0].loss
        assert results[-1].metrics["reward_accuracy"] == 1.0
        assert results[-1].metrics["rewards_chosen"] > results[-1].metrics["rewards_rejected"]
        # The reference session was only read: its log-probabilities are those of a fresh twin.
        assert reference.info().step == 0
        # Sent by the client instead, the reference log-probabilities give the same loss.
        ref_lp = reference.forward(ids, labels=labels, return_logprobs=True).logprobs
        by_id = policy.forward(ids, labels=labels, loss_fn="dpo", reference_session=reference.id)
        sent = policy.forward(ids, labels=labels, loss_fn="dpo", loss_fn_inputs={"reference_logprobs": ref_lp})
        assert sent.loss == pytest.approx(by_id.loss, rel=1e-6)
        # The formula, from both sessions' log-probabilities.
        lp = policy.forward(ids, labels=labels, return_logprobs=True).logprobs.astype(np.float64)
        margins = (lp - ref_lp).sum(axis=1)
        h = (margins[0::2] - margins[1::2]) * 0.1
        assert sent.loss == pytest.approx(np.mean(np.log1p(np.exp(-h))), rel=1e-4)


@pytest.mark.parametrize("loss_fn", ["simpo", "cpo", "orpo"])
def test_reference_free_preference_objectives_train(shared_server, loss_fn):
    client = shared_server.client()
    ids, labels = _batch(rows=4, seed=7)
    with _session(client, seed=2) as session:
        results = [session.train_step(ids, labels=labels, loss_fn=loss_fn, lr=3e-3) for _ in range(12)]
    assert all(math.isfinite(r.loss) for r in results)
    assert results[-1].loss < results[0].loss
    assert results[-1].metrics["reward_margin"] > results[0].metrics["reward_margin"]


def test_kto_with_a_reference_session_reports_its_kl_and_rewards(shared_server):
    client = shared_server.client()
    ids, labels = _batch(rows=4, seed=11)
    desirable = [True, False, True, False]
    with _session(client, seed=4) as policy, _session(client, seed=4) as reference:
        first = policy.train_step(ids, labels=labels, loss_fn="kto", loss_fn_inputs={"desirable": desirable},
                                  reference_session=reference, lr=3e-3)
        assert first.loss == pytest.approx(0.5, rel=1e-5)  # 1 - sigmoid(0) per row
        assert first.metrics["kl"] == pytest.approx(0, abs=1e-6)
        for _ in range(10):
            last = policy.train_step(ids, labels=labels, loss_fn="kto", loss_fn_inputs={"desirable": desirable},
                                     reference_session=reference, lr=3e-3)
        assert last.loss < first.loss
        assert last.metrics["rewards_desirable"] > last.metrics["rewards_undesirable"]


def test_a_custom_loss_equals_the_built_in_objective_it_restates(shared_server):
    """forward_backward_custom with importance sampling written by the client moves the weights exactly
    as the built-in importance_sampling does on a twin session."""
    client = shared_server.client()
    ids, labels = _batch(seed=13)
    valid = labels != -100
    rng = np.random.default_rng(2)
    with _session(client, seed=6) as custom, _session(client, seed=6) as builtin:
        lp0 = builtin.forward(ids, labels=labels, return_logprobs=True).logprobs.astype(np.float64)
        sampler = lp0 + 0.2 * rng.standard_normal(lp0.shape)
        advantages = rng.standard_normal(lp0.shape)
        tokens = valid.sum()

        def importance_sampling(lp):
            if hasattr(lp, "requires_grad"):  # torch is installed: a tensor, differentiated by autograd
                import torch
                ratio = torch.exp(lp - torch.from_numpy(sampler))
                return -(ratio * torch.from_numpy(advantages) * torch.from_numpy(valid)).sum() / tokens
            ratio = np.exp(np.asarray(lp, dtype=np.float64) - sampler)
            value = -(ratio * advantages)[valid].sum() / tokens
            return value, np.where(valid, -ratio * advantages / tokens, 0.0)

        # The asynchronous variant, with the update sent at once: it runs after the custom backward.
        mine = custom.forward_backward_custom_async(ids, importance_sampling, labels=labels)
        update = custom.optim_step_async(lr=1e-2)
        theirs = builtin.forward_backward(ids, labels=labels, loss_fn="importance_sampling",
                                          loss_fn_inputs={"logprobs": sampler, "advantages": advantages})
        assert mine.result(timeout=60).loss == pytest.approx(theirs.loss, rel=1e-5)
        assert update.result(timeout=60).step == 1
        builtin.optim_step(lr=1e-2)
        a = custom.forward(ids, labels=labels, return_logprobs=True).logprobs
        b = builtin.forward(ids, labels=labels, return_logprobs=True).logprobs
        assert np.abs(a - lp0).max() > 1e-4, "the step changed the model"
        np.testing.assert_allclose(a, b, rtol=0, atol=2e-5)

        # A loss that fails sends no backward, and the calls after it run at once.
        def broken(lp):
            raise ValueError("no loss today")
        with pytest.raises(ValueError, match="no loss today"):
            custom.forward_backward_custom(ids, broken, labels=labels)
        assert custom.forward_backward(ids, labels=labels, timeout=20).accumulated_batches == 1


def test_bad_objective_input_is_refused_and_nothing_is_applied(shared_server):
    client = shared_server.client()
    ids, labels = _batch()
    zeros = np.zeros(ids.shape)
    cases = [
        (dict(loss_fn="grpo"), "not one of"),
        (dict(loss_fn="ppo", loss_fn_inputs={"logprobs": zeros}), "needs advantages"),
        (dict(loss_fn="ppo", loss_fn_inputs={"logprobs": zeros, "advantages": np.full(ids.shape, np.nan)}),
         "is not finite"),
        (dict(loss_fn="ppo", loss_fn_inputs={"logprobs": zeros, "advantages": zeros}, loss_config={"beta": 1.0}),
         "not a setting of ppo"),
        (dict(loss_fn="cispo", loss_fn_inputs={"logprobs": zeros, "advantages": zeros},
              loss_config={"clip_low_threshold": 1.5}), "in [0, 1]"),
        (dict(loss_fn="cross_entropy", loss_fn_inputs={"advantages": zeros}), "not used by cross_entropy"),
        (dict(loss_fn="dpo", loss_config={"loss_type": "square"}), "not one of"),
        (dict(loss_fn="dpo"), "needs reference_logprobs"),
        (dict(loss_fn="kto", loss_fn_inputs={"reference_logprobs": zeros, "desirable": [1, 0, 1, 0]},
              reference_session="no-such-session"), "both"),
    ]
    with _session(client) as session:
        for kwargs, message in cases:
            with pytest.raises(tigon.InvalidArgument, match=message.replace("[", r"\[").replace("]", r"\]")):
                session.train_step(ids, labels=labels, **kwargs)
        # Pairs need an even number of rows; kto a flag per row.
        with pytest.raises(tigon.InvalidArgument, match="odd number of rows"):
            session.forward_backward(ids[:3], labels=labels[:3], loss_fn="simpo")
        with pytest.raises(tigon.InvalidArgument, match="desirable has 5 flags for 4 rows"):
            session.forward_backward(ids, labels=labels, loss_fn="kto",
                                     loss_fn_inputs={"reference_logprobs": zeros, "desirable": [1, 0, 1, 0, 1]})
        with pytest.raises(tigon.InvalidArgument, match="loss_weights"):
            session.forward_backward(ids, labels=labels, loss_weights=-np.ones(ids.shape))
        with pytest.raises(tigon.NotFound):
            session.train_step(ids, labels=labels, loss_fn="dpo", reference_session="no-such-session")
        with pytest.raises(tigon.InvalidArgument, match="names the session being trained"):
            session.train_step(ids, labels=labels, loss_fn="dpo", reference_session=session)
        info = session.info()
        assert info.step == 0 and info.accumulated_batches == 0
        # Signed weights are the linear objective's.
        assert session.forward_backward(ids, labels=labels, loss_weights=-np.ones(ids.shape),
                                        loss_fn="linear").accumulated_batches == 1


def test_the_dpo_example_shows_the_margin_and_accuracy_rise(shared_server):
    import re
    import subprocess
    import sys
    from conftest import ROOT
    script = f"{ROOT}/client/python/examples/dpo_tiny.py"
    out = subprocess.run([sys.executable, script, "--address", shared_server.address, "--steps", "40"],
                         env={"PYTHONPATH": f"{ROOT}/client/python"}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    rows = [tuple(map(float, m)) for m in
            re.findall(r"loss ([\d.]+)\s+reward margin ([-+\d.]+)\s+accuracy ([\d.]+)", out.stdout)]
    assert len(rows) == 5, out.stdout
    assert rows[0][0] == pytest.approx(0.6931, abs=1e-3)
    assert rows[-1][0] < 0.5 and rows[-1][1] > 0.5 and rows[-1][2] == 1.0, out.stdout
