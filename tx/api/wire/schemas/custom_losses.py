"""create_custom_loss: the traced torch.fx graph as the SDK encodes it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from tx.api.wire.schemas.base import WireRequest, WireResponse


class CustomLossNode(WireRequest):
    """One torch.fx node as the SDK encodes it; tx's trainer decides what it allows (never executed as code)."""

    op: Literal["placeholder", "get_attr", "call_function", "call_method", "call_module", "output"]
    name: Annotated[str, Field(max_length=256)]
    target: Annotated[str, Field(max_length=256)]
    args: list[Any] = []
    kwargs: dict[str, Any] = {}


class CustomLossGraph(WireRequest):
    format: Literal[1] = 1
    nodes: Annotated[list[CustomLossNode], Field(max_length=4096)]


class CustomLossInput(WireRequest):
    name: Annotated[str, Field(max_length=64)]
    rank: Literal[0, 1, 2]


class CreateCustomLossRequest(WireRequest):
    session_id: str
    custom_loss_seq_id: Annotated[int, Field(ge=0)]
    name: Annotated[str, Field(max_length=256)]
    inputs: Annotated[list[CustomLossInput], Field(min_length=1, max_length=16)]
    graph: CustomLossGraph
    type: Literal["create_custom_loss"] = "create_custom_loss"


class CreateCustomLossResponse(WireResponse):
    loss_id: str
    type: Literal["create_custom_loss"] = "create_custom_loss"
