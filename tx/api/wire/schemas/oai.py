"""OpenAI-compatible request and response bodies (/oai/api/v1): the fields tx honours, and refusals.

Requests ignore unknown keys. Their lists are counted before any item is validated (`counted_first`: a
4 MB body of 130,000 one-character messages took 0.3 s of the event loop to validate and 0.2 s more to hand
to a prompt worker; counted first, it is a 422 at once). A field tx cannot honour with a value that would
change the answer (echo, best_of > 1, logit_bias, penalties, tools, suffix) is refused with a 400 instead of
ignored. `logprobs`
(completions: 0-5 alternatives per token; chat: with `top_logprobs` 0-20) are the model's raw logprobs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tx.api.wire.schemas.base import counted_first
from tx.types import UserError

MAX_CHOICES = 16
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 64
# how many items a request's lists and maps may hold, counted before their items are validated
_COUNTS = {"messages": MAX_MESSAGES, "stop": 4, "logit_bias": 300, "tools": 128}


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    @model_validator(mode="before")
    @classmethod
    def _counted(cls, data: Any) -> Any:
        counted_first(data, _COUNTS)
        messages = data.get("messages") if isinstance(data, dict) else None
        for i, message in enumerate(messages if isinstance(messages, list) else ()):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and len(content) > MAX_CONTENT_PARTS:
                raise ValueError(f"messages[{i}].content holds {len(content)} parts; "
                                 f"at most {MAX_CONTENT_PARTS}")
        return data

    model: Annotated[str, Field(min_length=1, max_length=1024)]
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES)] = 1
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise UserError("stop takes at most 4 non-empty strings")
        return tuple(stops)

    def refuse_unsupported(self) -> None:
        if self.presence_penalty or self.frequency_penalty:
            raise UserError("presence_penalty and frequency_penalty are not supported (send 0 or leave them out)")
        if self.logit_bias:
            raise UserError("logit_bias is not supported")


class CompletionRequest(_Request):
    prompt: str | Annotated[list[int], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] = 16
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: bool = False
    best_of: int | None = None
    suffix: str | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.echo or (self.best_of or 1) > 1 or self.suffix:
            raise UserError("echo, best_of > 1 and suffix are not supported")

    def top_logprobs(self) -> int:
        """Alternatives per token: `logprobs` (0 gives the sampled tokens' logprobs only)."""
        return self.logprobs or 0


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        if any(part.get("type") != "text" for part in self.content):
            raise UserError("only text content parts are supported in chat messages")
        return "".join(str(part.get("text", "")) for part in self.content)


class ChatCompletionRequest(_Request):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    tools: list[Any] | None = None

    def refuse_unsupported(self) -> None:
        super().refuse_unsupported()
        if self.tools:
            raise UserError("tools are not supported; render tool prompts yourself and use /completions")
        if self.top_logprobs and not self.logprobs:
            raise UserError("top_logprobs needs logprobs=true")

    def alternatives(self) -> int:
        return self.top_logprobs or 0

    def max_new_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default
