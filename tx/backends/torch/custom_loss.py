"""Server-side custom losses: a torch.fx trace sent as JSON (`CustomLossGraph`), rebuilt and run here.

Security rules (the graph is untrusted data):
- Nothing in it is imported, evaluated or looked up by name. Functions come from `FUNCTIONS`, a
  table of callables built from this module's own list; tensor methods from `METHODS`, a table of
  `torch.Tensor` attributes built from a fixed list of names. A node naming anything else (for
  example `os.system` or `builtins.eval`) is a UserError (HTTP 400) that names the node.
- `getattr` is a function fx records for `x.shape`; it is allowed only on a tensor and only for
  the attribute names in `ATTRIBUTES`, so no attribute walk (`__class__`, `__globals__`) is possible.
- Arguments decode to JSON values, earlier nodes' values and a few torch constants (`_decode`); no
  argument can name a callable or a module. `get_attr` and `call_module` nodes are refused.
- The graph runs in an interpreter over its nodes (no code is generated) and every failure inside
  it is a UserError naming the node.
- It computes on tensors, within bounds (`custom_loss_limits.py`): Python arithmetic on the request's own
  constants is refused at upload, and what it may allocate, the Python numbers it may make and the time it
  may take are limited when it runs.

The loss runs once per datum, on (logprobs, *the loss_fn_inputs it names), and returns
(scalar loss, {"custom/<name>:sum|mean": scalar}); the losses are summed, as the SDK's own
client-side path (`run_loss_handle`) does, so both paths give the same result.
"""

from __future__ import annotations

import json
import math
import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.fx.node import _get_qualified_name

from tx.backends.torch.custom_loss_limits import LossBudget, check_constant, check_nesting, check_operands
from tx.types import CustomLoss, UserError

MAX_NODES = 4096
MAX_GRAPH_BYTES = 1 << 20  # the graph as JSON; a traced loss takes a few KiB
_METRIC_KEY = re.compile(r"custom/[a-z0-9_./-]{1,64}:(sum|mean)")
_INPUT_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")

_ALLOWED_FUNCTIONS: tuple[Callable[..., Any], ...] = (
    # Python operators (fx records arithmetic, comparisons and indexing as these)
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv, operator.mod,
    operator.pow, operator.neg, operator.pos, operator.abs, operator.matmul, operator.getitem,
    operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
    operator.and_, operator.or_, operator.xor, operator.invert,
    # math (on Python numbers, e.g. a shape)
    math.exp, math.log, math.log1p, math.sqrt, math.floor, math.ceil,
    # elementwise and reductions
    torch.exp, torch.log, torch.log1p, torch.expm1, torch.sigmoid, torch.tanh, torch.abs, torch.neg,
    torch.sqrt, torch.rsqrt, torch.square, torch.pow, torch.sign, torch.clamp, torch.clip,
    torch.minimum, torch.maximum, torch.min, torch.max, torch.where, torch.isfinite, torch.nan_to_num,
    torch.add, torch.sub, torch.mul, torch.div, torch.logaddexp, torch.lerp,
    torch.sum, torch.mean, torch.prod, torch.cumsum, torch.logsumexp, torch.softmax, torch.log_softmax,
    torch.stack, torch.cat, torch.zeros_like, torch.ones_like, torch.full_like, torch.gather,
    torch.topk, torch.sort, torch.argmax, torch.argmin, torch.any, torch.all, torch.logical_not,
    torch.logical_and, torch.logical_or, torch.numel, torch.flatten, torch.reshape, torch.squeeze,
    torch.unsqueeze, torch.transpose, torch.einsum, torch.dot, torch.matmul,
    F.logsigmoid, F.softplus, F.relu, F.log_softmax, F.softmax, F.mse_loss, F.smooth_l1_loss,
    F.l1_loss, F.binary_cross_entropy_with_logits, F.kl_div, F.cross_entropy, F.nll_loss, F.normalize,
)


def _wire_name(fn: Callable[..., Any]) -> str:
    """The name the SDK's encoder gives `fn` (fx's qualified name; `_operator.` sent as `operator.`)."""
    name = _get_qualified_name(fn)
    return "operator." + name.removeprefix("_operator.") if name.startswith("_operator.") else name


FUNCTIONS: dict[str, Callable[..., Any]] = {_wire_name(fn): fn for fn in _ALLOWED_FUNCTIONS}
PYTHON_OPERATORS = frozenset(name for name in FUNCTIONS if name.startswith(("operator.", "math.")))
GETATTR = "getattr"  # fx's target for attribute reads; checked by `_check_getattr`
ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "T", "mT"})
METHODS: dict[str, Callable[..., Any]] = {
    name: getattr(torch.Tensor, name)
    for name in (
        "sum", "mean", "prod", "exp", "log", "log1p", "expm1", "sigmoid", "tanh", "abs", "neg",
        "sqrt", "rsqrt", "square", "pow", "sign", "clamp", "clip", "clamp_min", "clamp_max",
        "min", "max", "minimum", "maximum", "add", "sub", "mul", "div", "float", "to", "type_as",
        "detach", "view", "reshape", "unsqueeze", "squeeze", "flatten", "expand", "expand_as",
        "size", "dim", "numel", "softmax", "log_softmax", "logsumexp", "cumsum", "masked_fill",
        "where", "gather", "ne", "eq", "gt", "lt", "ge", "le", "logical_not", "any", "all",
        "contiguous", "t", "transpose", "permute", "topk", "sort", "argmax", "argmin",
        "nan_to_num", "isfinite", "norm",
    )
}
_DTYPES = {
    name: getattr(torch, name)
    for name in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "bool")
}
_LAYOUTS = {"strided": torch.strided}
_MEMORY_FORMATS = {"contiguous_format": torch.contiguous_format, "preserve_format": torch.preserve_format}
_FLOATS = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}


@dataclass(frozen=True)
class _Ref:
    name: str


@dataclass(frozen=True)
class _Node:
    op: str
    name: str
    target: str
    args: tuple[Any, ...]  # decoded: _Ref for node values, constants otherwise
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class CompiledLoss:
    """A custom loss checked against the allowlist, ready to run on one datum at a time."""

    name: str
    input_names: tuple[str, ...]  # the loss_fn_inputs keys it reads, after logprobs
    nodes: tuple[_Node, ...]

    def __call__(self, logprobs: torch.Tensor, inputs: Sequence[torch.Tensor],
                 budget: LossBudget | None = None) -> tuple[torch.Tensor, dict]:
        budget = budget or LossBudget()
        values: dict[str, Any] = {}
        placeholders = iter((logprobs, *inputs))
        for node in self.nodes:
            try:
                if node.op == "placeholder":
                    values[node.name] = next(placeholders)
                elif node.op == "output":
                    return _resolve(node.args[0], values)
                else:
                    args, kwargs = _resolve(node.args, values), _resolve(node.kwargs, values)
                    where = f"custom loss {self.name!r}, node {node.name!r}"
                    budget.before(where, node.target, node.target in PYTHON_OPERATORS, args, kwargs)
                    values[node.name] = _call(node, args, kwargs)
                    budget.after(where, values[node.name])
            except UserError:
                raise
            except Exception as exc:  # any failure of the user's graph is the user's error
                raise UserError(f"custom loss {self.name!r} failed at node {node.name!r} ({node.target}): {exc}") from None
        raise UserError(f"custom loss {self.name!r} has no output node")


def compile_loss(loss: CustomLoss) -> CompiledLoss:
    """Check `loss` against the allowlist and the graph's structure; a UserError names what is refused."""
    _check_inputs(loss)
    if not loss.nodes:
        raise UserError("custom loss graph has no nodes")
    if len(loss.nodes) > MAX_NODES:
        raise UserError(f"custom loss graph has {len(loss.nodes)} nodes; at most {MAX_NODES} are accepted")
    for index, raw in enumerate(loss.nodes):
        check_nesting(raw, f"custom loss graph node {raw.get('name', index) if isinstance(raw, dict) else index!r}")
    size = len(json.dumps(loss.nodes, default=str))
    if size > MAX_GRAPH_BYTES:
        raise UserError(f"custom loss graph is {size} bytes of JSON; at most {MAX_GRAPH_BYTES} are accepted")
    nodes: list[_Node] = []
    seen: set[str] = set()
    for raw in loss.nodes:
        node = _parse_node(raw, seen)
        _check_node(node)
        nodes.append(node)
        seen.add(node.name)
    placeholders = [n.target for n in nodes if n.op == "placeholder"]
    if placeholders != [name for name, _ in loss.inputs]:
        raise UserError(f"custom loss graph's placeholders {placeholders} do not match its inputs "
                        f"{[name for name, _ in loss.inputs]}")
    if nodes[-1].op != "output" or sum(n.op == "output" for n in nodes) != 1:
        raise UserError("custom loss graph must end with its one output node")
    _check_output(nodes[-1])
    return CompiledLoss(
        name=loss.name,
        input_names=tuple(name for name, _ in loss.inputs[1:]),
        nodes=tuple(nodes),
    )


def _check_inputs(loss: CustomLoss) -> None:
    if not loss.inputs or loss.inputs[0][0] != "logprobs":
        raise UserError("custom loss inputs must start with logprobs")
    if loss.inputs[0][1] not in (1, 2):
        raise UserError("custom loss: logprobs has rank 1 ([T]) or 2 ([T, K])")
    names = [name for name, _ in loss.inputs]
    if len(set(names)) != len(names):
        raise UserError(f"custom loss inputs repeat a name: {names}")
    for name, rank in loss.inputs:
        if not _INPUT_NAME.fullmatch(name) or rank not in (0, 1, 2):
            raise UserError(f"custom loss input {name!r} (rank {rank}) must be a lowercase name with rank 0, 1 or 2")


def _parse_node(raw: Any, seen: set[str]) -> _Node:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or not isinstance(raw.get("target"), str):
        raise UserError(f"custom loss graph node {raw!r:.80} lacks a name or target")
    name = raw["name"]
    if name in seen:
        raise UserError(f"custom loss graph node {name!r} is defined twice")
    args, kwargs = raw.get("args", []), raw.get("kwargs", {})
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UserError(f"custom loss graph node {name!r}: args must be a list and kwargs an object")
    check_nesting([args, kwargs], f"custom loss graph node {name!r}")
    decode = lambda value: _decode(value, seen, name)  # noqa: E731
    return _Node(
        op=str(raw.get("op")), name=name, target=raw["target"],
        args=tuple(decode(a) for a in args), kwargs={str(k): decode(v) for k, v in kwargs.items()},
    )


def _check_node(node: _Node) -> None:
    where = f"custom loss graph node {node.name!r}"
    if node.op == "call_function":
        if node.target == GETATTR:
            _check_getattr(node, where)
        elif node.target not in FUNCTIONS:
            raise UserError(f"{where} calls {node.target!r}, which is not an allowed function")
        elif node.target in PYTHON_OPERATORS:
            check_operands(where, node.target, node.args, node.kwargs, _Ref)
    elif node.op == "call_method":
        if node.target not in METHODS:
            raise UserError(f"{where} calls method {node.target!r}, which is not an allowed tensor method")
        if not node.args:
            raise UserError(f"{where} calls method {node.target!r} without a tensor")
    elif node.op in ("get_attr", "call_module"):
        raise UserError(f"{where} is a {node.op} node ({node.target!r}); custom losses may not read modules or attributes")
    elif node.op not in ("placeholder", "output"):
        raise UserError(f"{where} has op {node.op!r}, which is not a torch.fx node kind")


def _check_getattr(node: _Node, where: str) -> None:
    if len(node.args) != 2 or node.kwargs or not isinstance(node.args[0], _Ref):
        raise UserError(f"{where}: getattr must read an attribute of a graph value")
    if node.args[1] not in ATTRIBUTES:
        raise UserError(f"{where} reads attribute {node.args[1]!r}, which is not allowed "
                        f"(allowed: {', '.join(sorted(ATTRIBUTES))})")


def _check_output(node: _Node) -> None:
    result = node.args[0] if len(node.args) == 1 else None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], dict)):
        raise UserError("custom loss graph must return (loss, metrics)")
    for key in result[1]:
        if not _METRIC_KEY.fullmatch(key):
            raise UserError(f"custom loss metric {key!r} must be named custom/<name>:sum or custom/<name>:mean")


def _decode(value: Any, seen: set[str], where: str) -> Any:
    """An encoded argument as a value: constants, _Ref to earlier nodes, tuples, dicts, slices."""
    if value is None or isinstance(value, (bool, int, float, str)):
        check_constant(value, f"custom loss graph node {where!r}")
        return value
    if isinstance(value, list):
        return [_decode(v, seen, where) for v in value]
    if not (isinstance(value, dict) and len(value) == 1):
        raise UserError(f"custom loss graph node {where!r} has an argument that cannot be decoded: {value!r:.80}")
    (kind, payload), = value.items()
    if kind == "ref":
        if payload not in seen:
            raise UserError(f"custom loss graph node {where!r} refers to {payload!r}, which is not an earlier node")
        return _Ref(payload)
    if kind == "tuple" and isinstance(payload, list):
        return tuple(_decode(v, seen, where) for v in payload)
    if kind == "dict" and isinstance(payload, dict):
        return {str(k): _decode(v, seen, where) for k, v in payload.items()}
    if kind == "slice" and isinstance(payload, list) and len(payload) == 3:
        return slice(*(_decode(v, seen, where) for v in payload))
    if kind == "ellipsis" and payload is True:
        return Ellipsis
    table = {"float": _FLOATS, "dtype": _DTYPES, "layout": _LAYOUTS, "memory_format": _MEMORY_FORMATS}.get(kind)
    if table is not None and isinstance(payload, str) and payload in table:
        return table[payload]
    raise UserError(f"custom loss graph node {where!r} has an argument {kind!r}: {payload!r:.40} that is not allowed")


def _resolve(value: Any, values: dict[str, Any]) -> Any:
    if isinstance(value, _Ref):
        return values[value.name]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, values) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, values) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(_resolve(value.start, values), _resolve(value.stop, values), _resolve(value.step, values))
    return value


def _call(node: _Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if node.op == "call_method":
        if not isinstance(args[0], torch.Tensor):
            raise UserError(f"custom loss graph node {node.name!r} calls {node.target!r} on a non-tensor")
        return METHODS[node.target](*args, **kwargs)
    if node.target == GETATTR:
        if not isinstance(args[0], torch.Tensor):
            raise UserError(f"custom loss graph node {node.name!r} reads an attribute of a non-tensor")
        return getattr(args[0], args[1])  # args[1] is in ATTRIBUTES (checked at compile time)
    return FUNCTIONS[node.target](*args, **kwargs)


def run_on_data(
    loss: CompiledLoss, logprobs: Sequence[torch.Tensor], data_inputs: Sequence[dict[str, Any]], device: torch.device,
    budget: LossBudget | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Σ over datums of the loss on (datum logprobs, its named inputs), and the sum of each metric over them
    (`reduce_metrics` averages the :mean ones once every micro-batch is done).

    `logprobs[i]` is datum i's (N,) or (N, K) tensor; `data_inputs[i]` its loss_fn_inputs (numpy), which
    `tx.backends.datums.check_custom_inputs` has checked against the loss's declared inputs. `budget`: the limits
    of the whole forward_backward (one per call; a new one when not given)."""
    budget = budget or LossBudget()
    total: torch.Tensor | None = None
    sums: dict[str, float] = {}
    for index, (lp, inputs) in enumerate(zip(logprobs, data_inputs, strict=True)):
        args = [torch.as_tensor(inputs[name]).to(device) for name in loss.input_names]
        budget.admit_inputs([lp, *args])
        value, metrics = loss(lp, args, budget)
        if not isinstance(value, torch.Tensor) or value.ndim != 0 or not value.is_floating_point():
            raise UserError(f"datum {index}: loss {loss.name!r} must return a scalar float tensor")
        total = value if total is None else total + value
        for key, metric in metrics.items():
            sums[key] = sums.get(key, 0.0) + float(torch.as_tensor(metric).detach().sum())
    assert total is not None
    return total, sums


def reduce_metrics(sums: dict[str, float], num_datums: int) -> dict[str, float]:
    """Metric sums over a request's datums -> their values: :sum as is, :mean divided by the datums."""
    return {key: value / num_datums if key.endswith(":mean") else value for key, value in sums.items()}
