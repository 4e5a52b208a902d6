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
from tx.backends.torch.custom_loss_limits import LossBudget
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


# ---- the bounds (tx/backends/torch/custom_loss_limits.py): the shared-server probe's finding 1


def _graph(*nodes: dict, out: str = "loss") -> CustomLoss:
    head = [{"op": "placeholder", "name": "logprobs", "target": "logprobs"}]
    tail = [{"op": "output", "name": "output", "target": "output",
             "args": [{"tuple": [{"ref": out}, {"dict": {}}]}]}]
    return CustomLoss("s:loss:1", "s", "probe", (("logprobs", 1),), tuple(head + list(nodes) + tail))


def _call(name: str, target: str, *args, op: str = "call_function") -> dict:
    return {"op": op, "name": name, "target": target, "args": list(args)}


SUM = _call("loss", "sum", {"ref": "x"}, op="call_method")
LENGTH = _call("n", "operator.getitem", {"ref": "shape"}, 0)
SHAPE = _call("shape", "getattr", {"ref": "logprobs"}, "shape")


@pytest.mark.parametrize(("node", "refused"), [
    (_call("x", "operator.pow", 3, 20_000_000), "node 'x' computes operator.pow on the request's constants only"),
    (_call("x", "operator.mul", "A", 10**9), "node 'x' computes operator.mul on the request's constants only"),
    (_call("x", "operator.mul", {"ref": "logprobs"}, "A"), "node 'x' passes a str constant to operator.mul"),
    (_call("x", "operator.add", {"ref": "logprobs"}, 10**30), "node 'x' has an integer constant outside 64 bits"),
])
def test_python_arithmetic_on_request_values_is_refused_at_upload(node: dict, refused: str) -> None:
    with pytest.raises(UserError, match=refused):
        compile_loss(_graph(node, SUM))


def test_deeply_nested_arguments_are_a_user_error() -> None:
    nested: object = {"ref": "logprobs"}
    for _ in range(600):
        nested = [nested]
    with pytest.raises(UserError, match="node 'x' has arguments nested over 16 deep"):
        compile_loss(_graph(_call("x", "torch.stack", nested), SUM))


def _run(loss: CustomLoss, budget: LossBudget | None = None) -> None:
    lp = torch.zeros(8, requires_grad=True)
    run_on_data(compile_loss(loss), [lp], [{}], torch.device("cpu"), budget)


def test_tensors_past_the_element_limit_are_refused_before_they_are_made() -> None:
    expand = _call("big", "expand", {"ref": "logprobs"}, 1 << 22, 8, op="call_method")
    loss = _graph(expand, _call("x", "contiguous", {"ref": "big"}, op="call_method"), SUM)
    with pytest.raises(UserError, match="node 'big' would make a tensor of 33554432 elements"):
        _run(loss)
    column = _call("col", "unsqueeze", {"ref": "logprobs"}, 1, op="call_method")
    small = LossBudget(min_elements=32)  # 4 x the 8 logprobs: an 8 x 8 outer product is over it
    for grow in (_call("x", "operator.mul", {"ref": "col"}, {"ref": "logprobs"}),
                 _call("x", "torch.matmul", {"ref": "col"}, {"ref": "row"})):
        row = _call("row", "unsqueeze", {"ref": "logprobs"}, 0, op="call_method")
        with pytest.raises(UserError, match="node 'x' would make a tensor of 64 elements; .* at most 32"):
            _run(_graph(column, row, grow, SUM), small)
        _run(_graph(column, row, grow, SUM))  # under the default limit


def test_python_numbers_stay_small_when_the_graph_runs() -> None:
    power = _call("p", "operator.pow", {"ref": "n"}, 100_000_000)
    with pytest.raises(UserError, match="node 'p' raises a Python number to the power 100000000"):
        _run(_graph(SHAPE, LENGTH, power, _call("x", "operator.mul", {"ref": "logprobs"}, {"ref": "p"}), SUM))
    repeat = _call("r", "operator.mul", {"ref": "shape"}, 10**9)
    with pytest.raises(UserError, match="node 'r' applies operator.mul to a Size"):
        _run(_graph(SHAPE, repeat, _call("x", "operator.mul", {"ref": "logprobs"}, 1.0), SUM))
    squares = [_call("q0", "operator.mul", {"ref": "n"}, 2**40)]
    squares += [_call(f"q{i}", "operator.mul", {"ref": f"q{i - 1}"}, {"ref": f"q{i - 1}"}) for i in range(1, 4)]
    with pytest.raises(UserError, match="node 'q1' made an integer outside 64 bits"):
        _run(_graph(SHAPE, LENGTH, *squares, _call("x", "operator.mul", {"ref": "logprobs"}, 1.0), SUM))


def test_a_loss_past_its_time_is_stopped() -> None:
    loss = _graph(_call("x", "operator.mul", {"ref": "logprobs"}, 2.0), SUM)
    with pytest.raises(UserError, match="node 'x': the custom loss ran over its 0 s"):
        _run(loss, LossBudget(max_seconds=0))
