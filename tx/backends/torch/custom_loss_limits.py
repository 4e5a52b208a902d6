"""The bounds an uploaded custom loss runs under (`custom_loss.py` rebuilds and runs the graph).

A graph is untrusted data that runs on the training thread. Allowlisting its functions is not enough: plain
Python arithmetic on the numbers in the graph can hold the GIL for hours (`pow(3, 10**9)`), and a few tensor
calls can allocate without a bound (`expand(...).contiguous()`). So:

- At upload (`check_operands`): a Python operator or `math` call must take a graph value; one that computes on
  the request's own constants only is refused with a 400 naming the node (fx folds such arithmetic when it
  traces, so a traced loss never holds one). Its constant operands are numbers (getitem: also slices, None,
  Ellipsis and tuples of those); strings and containers are refused. Arguments nest at most `MAX_DEPTH` deep,
  hold at most `MAX_ITEMS` values per node, and integers fit in 64 bits.
- When it runs (`LossBudget`): a Python operator on non-tensors takes numbers only (a shape's `Size` for
  getitem), `pow` on them an exponent of at most `MAX_PY_EXPONENT`, and every integer result fits in 64 bits.
  Before a call that makes a tensor, the elements it can make are bounded from its arguments' shapes
  (broadcasting, matmul, einsum, expand, cat/stack); after it, its result is checked again. The limit is
  `max(MIN_ELEMENTS, ELEMENTS_PER_INPUT x the largest input)`. The whole loss of one forward_backward (every
  datum) has `MAX_SECONDS`; past it, the call fails with a user error naming the node it reached.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import Any

import torch

from tx.types import UserError

MAX_DEPTH = 16  # nesting of a node and its arguments (a traced loss's reach 7)
MAX_ITEMS = 512  # values in one node's arguments, all levels together
MAX_INT = 2**63  # integers, as constants or as Python results, stay within +-MAX_INT
MAX_PY_EXPONENT = 64  # pow on Python numbers
MIN_ELEMENTS = 1 << 24  # any one tensor a loss makes may hold this many elements ...
ELEMENTS_PER_INPUT = 4  # ... or this many times its largest input's
MAX_SECONDS = 60.0  # one forward_backward's custom loss, over all its datums


def check_constant(value: object, where: str) -> None:
    """A JSON constant of a node's arguments: integers within 64 bits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
        raise UserError(f"{where} has an integer constant outside 64 bits")


def check_operands(where: str, target: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                   is_ref: type) -> None:
    """Upload-time rule for a Python operator or `math` call (see the module docstring)."""
    values = list(_flat((args, kwargs)))
    if not any(isinstance(v, is_ref) for v in values):
        raise UserError(f"{where} computes {target} on the request's constants only; custom losses compute on "
                        "the graph's values (fold constant arithmetic into the loss before tracing)")
    allowed = _INDEX_CONSTANTS if target == "operator.getitem" else _NUMBER_CONSTANTS
    for value in values:
        if not isinstance(value, (is_ref, *allowed)):
            raise UserError(f"{where} passes a {type(value).__name__} constant to {target}; Python operators "
                            "take numbers here")


_NUMBER_CONSTANTS = (bool, int, float)
_INDEX_CONSTANTS = (bool, int, float, slice, type(None), type(Ellipsis))


def check_nesting(value: Any, where: str) -> None:
    """Refuse arguments nested over MAX_DEPTH or holding over MAX_ITEMS values (before decoding them)."""
    count, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise UserError(f"{where} has arguments nested over {MAX_DEPTH} deep")
        if count > MAX_ITEMS:
            raise UserError(f"{where} has over {MAX_ITEMS} argument values")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


class LossBudget:
    """The limits of one forward_backward's custom loss: elements per tensor and time (see the docstring)."""

    def __init__(self, max_seconds: float = MAX_SECONDS, min_elements: int = MIN_ELEMENTS) -> None:
        self.deadline = time.monotonic() + max_seconds
        self.max_seconds = max_seconds
        self.max_elements = min_elements

    def admit_inputs(self, tensors: list[torch.Tensor]) -> None:
        """Raise the element limit to ELEMENTS_PER_INPUT x the largest of a datum's inputs."""
        largest = max((t.numel() for t in tensors), default=0)
        self.max_elements = max(self.max_elements, ELEMENTS_PER_INPUT * largest)

    def before(self, where: str, target: str, python_op: bool, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
        if time.monotonic() > self.deadline:
            raise UserError(f"{where}: the custom loss ran over its {self.max_seconds:g} s")
        tensors = [v for v in _flat((args, kwargs)) if isinstance(v, torch.Tensor)]
        if not tensors:
            if python_op:
                _check_python_operands(where, target, args)
            return
        projected = projected_elements(target, args, tensors)
        if projected > self.max_elements:
            raise UserError(f"{where} would make a tensor of {projected} elements; custom losses may make at "
                            f"most {self.max_elements}")

    def after(self, where: str, result: Any) -> None:
        for value in _flat(result):
            if isinstance(value, torch.Tensor) and value.numel() > self.max_elements:
                raise UserError(f"{where} made a tensor of {value.numel()} elements; custom losses may make at "
                                f"most {self.max_elements}")
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
                raise UserError(f"{where} made an integer outside 64 bits")


def _check_python_operands(where: str, target: str, args: tuple[Any, ...]) -> None:
    for index, value in enumerate(args):
        container = target == "operator.getitem" and index == 0 and isinstance(value, tuple)  # a torch.Size
        if not (container or isinstance(value, (*_INDEX_CONSTANTS, float))):
            raise UserError(f"{where} applies {target} to a {type(value).__name__}; Python operators take numbers")
    if target == "operator.pow" and len(args) == 2 and isinstance(args[1], (int, float)):
        if abs(args[1]) > MAX_PY_EXPONENT:
            raise UserError(f"{where} raises a Python number to the power {args[1]}; at most {MAX_PY_EXPONENT}")


def projected_elements(target: str, args: tuple[Any, ...], tensors: list[torch.Tensor]) -> int:
    """An upper bound on the elements of the tensor `target` makes from these arguments, from shapes only."""
    if target in ("expand", "expand_as"):
        return _expand(args)
    if target in ("torch.matmul", "operator.matmul", "torch.dot") and len(tensors) == 2:
        return _matmul(tensors[0].shape, tensors[1].shape)
    if target == "torch.einsum" and args and isinstance(args[0], str):
        return _einsum(args[0], tensors)
    if target in ("torch.cat", "torch.stack"):
        return sum(t.numel() for t in tensors)
    return _broadcast(t.shape for t in tensors)


def _expand(args: tuple[Any, ...]) -> int:
    tensor = args[0]
    if len(args) == 2 and isinstance(args[1], torch.Tensor):
        return args[1].numel()
    sizes = args[1:]
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    largest = max(tensor.shape, default=1)
    return math.prod(int(s) if isinstance(s, int) and s > 0 else largest for s in sizes)


def _broadcast(shapes: Iterator[torch.Size] | Any) -> int:
    dims: list[int] = []
    for shape in shapes:
        for i, size in enumerate(reversed(shape)):
            if i == len(dims):
                dims.append(size)
            else:
                dims[i] = max(dims[i], size)
    return math.prod(dims)


def _matmul(a: torch.Size, b: torch.Size) -> int:
    rows = a[-2] if len(a) >= 2 else 1
    cols = b[-1] if len(b) >= 2 else 1
    return _broadcast(iter([a[:-2], b[:-2]])) * rows * cols


def _einsum(equation: str, tensors: list[torch.Tensor]) -> int:
    inputs, _, output = equation.replace(" ", "").partition("->")
    sizes: dict[str, int] = {}
    for spec, tensor in zip(inputs.split(","), tensors):
        letters = spec.replace("...", "")
        for letter, size in zip(letters, tensor.shape[-len(letters):] if letters else ()):
            sizes[letter] = max(sizes.get(letter, 1), size)
    if not _:
        output = "".join(sorted(k for k in sizes if inputs.count(k) == 1))
    ellipsis = max((t.numel() for t in tensors), default=1) if "..." in equation else 1
    return ellipsis * math.prod(sizes.get(letter, 1) for letter in output.replace("...", ""))


def _flat(value: Any) -> Iterator[Any]:
    """The leaves of nested tuples, lists and dicts (a torch.Size is a leaf)."""
    if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size):
        for item in value:
            yield from _flat(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _flat(item)
    else:
        yield value
