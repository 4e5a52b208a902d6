"""Weight transfer between the trainer (sender) and inference engines (receivers).

Collective groups (gloo on CPU, NCCL between GPUs) through `BroadcastSender` / `BroadcastReceiver`, and
CUDA IPC on one shared GPU through `IpcSender` / `IpcReceiver`.
Control messages are the pydantic models in `types`; `transport.choose_transport` picks gloo, NCCL or IPC.
"""

from tx.inference.weight_sync.broadcast import BroadcastReceiver, BroadcastSender
from tx.inference.weight_sync.group import free_port
from tx.inference.weight_sync.ipc import IpcReceiver, IpcSender, cuda_device_uuid
from tx.inference.weight_sync.plan import DEFAULT_BUCKET_BYTES, Bucket, layout_buckets, plan_update, view_in
from tx.inference.weight_sync.transport import (
    EngineFacts,
    TrainerFacts,
    Transport,
    TransportChoice,
    choose_transport,
    local_address_towards,
    trainer_facts,
)
from tx.inference.weight_sync.types import (
    DTYPES,
    CudaIpcHandle,
    IpcBucket,
    IpcTensorSpec,
    IpcUpdate,
    TensorSpec,
    TransferInit,
    TransferUpdate,
    WeightSyncError,
    dtype_from_name,
    dtype_name,
)

__all__ = [
    "DEFAULT_BUCKET_BYTES",
    "DTYPES",
    "Bucket",
    "BroadcastReceiver",
    "BroadcastSender",
    "CudaIpcHandle",
    "EngineFacts",
    "IpcBucket",
    "IpcReceiver",
    "IpcSender",
    "IpcTensorSpec",
    "IpcUpdate",
    "TensorSpec",
    "TrainerFacts",
    "TransferInit",
    "TransferUpdate",
    "Transport",
    "TransportChoice",
    "WeightSyncError",
    "choose_transport",
    "cuda_device_uuid",
    "dtype_from_name",
    "dtype_name",
    "free_port",
    "layout_buckets",
    "local_address_towards",
    "plan_update",
    "trainer_facts",
    "view_in",
]
