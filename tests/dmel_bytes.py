"""DMel clips as the SDK carries them in a `DmelChunk`: a TensorContainer's bytes, written here by hand (an optional
constant marker 254, the dtype byte, the rank and each dimension as varints, then the data), so a test can also
write the malformed ones a client might send. tests/integration/test_audio.py checks these bytes against the
cookbook's own serializer (tml-renderers)."""

from __future__ import annotations

import numpy as np

DTYPES = {2: "<i4", 3: "<i8", 4: "u1"}  # the container's dtype byte -> numpy's


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def tensor_container(levels: np.ndarray, dtype_byte: int = 4, constant: bool = False) -> bytes:
    """`levels` (frames x mel bins) as a TensorContainer of dtype `dtype_byte` (uint8 by default; 2 = int32,
    3 = int64); `constant`: every value is the first, sent once."""
    header = (b"\xfe" if constant else b"") + bytes([dtype_byte]) + varint(levels.ndim)
    header += b"".join(varint(d) for d in levels.shape)
    data = levels.reshape(-1)[:1] if constant else levels
    return header + np.ascontiguousarray(data, dtype=DTYPES[dtype_byte]).tobytes()
