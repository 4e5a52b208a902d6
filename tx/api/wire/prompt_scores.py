"""The prompt scores of a SampleResponse in protobuf: `target_prompt_logprobs` as a Tensor laid out as its request
was (dense, or CSR with the request's row pointers and column indices), and `prompt_alt_tokens` as two dense
Tensors; the top-k of sampled tokens goes through `codec._topk_logprobs` like the prompt's."""

from __future__ import annotations

import numpy as np

from tx.api.wire import tinker_public_pb2 as pb
from tx.types import TargetLogprobs


def target_tensor(target: TargetLogprobs) -> pb.Tensor:
    values = np.asarray(target.values, dtype=np.float32)
    msg = pb.Tensor(dtype=pb.DTYPE_FLOAT32, shape=list(values.shape))
    if target.csr is None:
        msg.dense = values.astype("<f4").tobytes()
        return msg
    crow, col = target.csr
    rows = np.repeat(np.arange(len(crow) - 1), np.diff(crow))
    msg.sparse_csr.CopyFrom(pb.SparseCsr(values=values[rows, col].astype("<f4").tobytes(),
                                         crow_indices=crow.astype("<i8").tobytes(),
                                         col_indices=col.astype("<i8").tobytes()))
    return msg


def alt_tokens(tokens: np.ndarray, logprobs: np.ndarray) -> pb.PromptAltTokens:
    return pb.PromptAltTokens(tokens=_dense(np.asarray(tokens, np.int64), pb.DTYPE_INT64, "<i8"),
                              logprobs=_dense(np.asarray(logprobs, np.float32), pb.DTYPE_FLOAT32, "<f4"))


def _dense(array: np.ndarray, dtype: pb.DType, layout: str) -> pb.Tensor:
    return pb.Tensor(dense=array.astype(layout).tobytes(), dtype=dtype, shape=list(array.shape))
