"""The custom-loss interpreter on graphs the SDK's own tracer and encoder produce, and the checks of a datum's inputs
against the ones a loss declares (`tx/backends/datums.py`, at submission and before it runs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from tx.backends.datums import check_custom_inputs
from tx.backends.torch.custom_loss import compile_loss, reduce_metrics, run_on_data
from tx.types import CustomLoss, Datum, ModelInput, UserError


def uploaded(fn, ranks) -> CustomLoss:
    handle = trace_loss(fn, ranks, "s")
    nodes = [node.model_dump() for node in encode_graph(handle).nodes]
    return CustomLoss("s:loss:0", "s", handle.name, tuple((i.name, i.rank) for i in handle.inputs), tuple(nodes))


def shapes_and_slices(logprobs, weights, scale):
    n = logprobs.shape[0]
    head = logprobs[: n // 2, ...]
    loss = -(head * weights[: n // 2]).sum() / n + torch.clamp(logprobs, min=-3.0).mean() * scale
    loss = loss + math.log(2.0) * torch.where(weights > 0.5, logprobs, 0.0 * logprobs).sum()
    return loss, {"custom/head:sum": head.sum(), "custom/scale:mean": scale * 1.0}


def test_interpreter_matches_running_the_function():
    loss = compile_loss(uploaded(shapes_and_slices, {"logprobs": 1, "weights": 1, "scale": 0}))
    rng = np.random.default_rng(0)
    lps = [torch.tensor(-rng.uniform(0.1, 5, size=n), dtype=torch.float32, requires_grad=True) for n in (6, 9)]
    inputs = [{"weights": rng.uniform(size=lp.shape[0]).astype(np.float32), "scale": np.float32(0.5)} for lp in lps]
    total, sums = run_on_data(loss, lps, inputs, torch.device("cpu"))
    metrics = reduce_metrics(sums, len(lps))
    want = [shapes_and_slices(lp, torch.as_tensor(i["weights"]), torch.as_tensor(i["scale"])) for lp, i in zip(lps, inputs)]
    assert float(total) == pytest.approx(float(sum(w[0] for w in want)), rel=1e-6)
    assert metrics["custom/head:sum"] == pytest.approx(float(sum(w[1]["custom/head:sum"] for w in want)), rel=1e-6)
    assert metrics["custom/scale:mean"] == pytest.approx(0.5)
    total.backward()
    assert all(lp.grad is not None and torch.isfinite(lp.grad).all() for lp in lps)


def test_runtime_failures_are_user_errors():
    loss = compile_loss(uploaded(shapes_and_slices, {"logprobs": 1, "weights": 1, "scale": 0}))
    lp = torch.zeros(4, requires_grad=True)
    with pytest.raises(UserError, match="failed at node"):  # weights of the wrong length
        run_on_data(loss, [lp], [{"weights": np.ones(7, np.float32), "scale": np.float32(1)}], torch.device("cpu"))


def test_inputs_that_do_not_fit_the_declared_ones_are_refused_before_it_runs():
    declared = uploaded(shapes_and_slices, {"logprobs": 1, "weights": 1, "scale": 0})
    targets = np.zeros(4, np.int64)

    def datum(**inputs) -> Datum:
        return Datum(ModelInput.from_tokens([1, 2, 3, 4]), {"target_tokens": targets, **inputs})

    good = datum(weights=np.ones(4, np.float32), scale=np.float32(1))
    check_custom_inputs(declared, [good])
    with pytest.raises(UserError, match="datum 1: loss_fn_inputs\\['scale'\\] has rank 1.*declared it with rank 0"):
        check_custom_inputs(declared, [good, datum(weights=np.ones(4, np.float32), scale=np.ones(2, np.float32))])
    with pytest.raises(UserError, match="datum 0: loss_fn_inputs lacks 'weights'"):
        check_custom_inputs(declared, [datum(scale=np.float32(1))])
    with pytest.raises(UserError, match="takes logprobs of rank 1, but target_tokens has rank 2"):
        check_custom_inputs(declared, [Datum(ModelInput.from_tokens([1]), {"target_tokens": np.zeros((1, 2), np.int64),
                                                                        "weights": np.ones(1), "scale": 1.0})])


def test_bad_metric_names_and_inputs_are_refused():
    good = uploaded(shapes_and_slices, {"logprobs": 1, "weights": 1, "scale": 0})
    nodes = list(good.nodes)
    nodes[-1] = {**nodes[-1], "args": [{"tuple": [{"ref": nodes[-2]["name"]}, {"dict": {"loss:sum": {"ref": "logprobs"}}}]}]}
    with pytest.raises(UserError, match="custom/<name>:sum"):
        compile_loss(CustomLoss("i", "s", "x", good.inputs, tuple(nodes)))
    with pytest.raises(UserError, match="start with logprobs"):
        compile_loss(CustomLoss("i", "s", "x", (("weights", 1),), good.nodes))
    with pytest.raises(UserError, match="do not match its inputs"):
        compile_loss(CustomLoss("i", "s", "x", (("logprobs", 1), ("weights", 1)), good.nodes))
