"""The run precisions by name: the one table the CLI, the nodes, the runtime, the tiny
checkpoint writers and the reference checks read, and the parser of a name or a torch.dtype."""
from __future__ import annotations

import torch

from ..errors import ArgumentError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


def parse_dtype(value: str | torch.dtype, what: str = "dtype") -> torch.dtype:
    """`value` (a name in `DTYPES` or one of its torch dtypes) as a torch dtype; otherwise an
    `ArgumentError` (a `ValueError`) naming `what`."""
    dtype = DTYPES.get(value) if isinstance(value, str) else value
    if dtype not in DTYPE_NAMES:
        raise ArgumentError(f"{what} must be one of {', '.join(DTYPES)}, got {value!r}")
    return dtype
