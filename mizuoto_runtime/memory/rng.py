"""The process's RNG lock (M8, M40, M57).

Torch's global RNG is one per process. Code that draws from it (upstream engines' sampling, in
`Engine.seeded`), the exact retry's restore of it (`phases`) and a CUDA Graph capture, which
must see no other thread's draw (`graphs.capture`), hold this lock, so two requests at once
(`compute.gpu_jobs` > 1) take turns there instead of drawing from each other's sequence.
Nothing here imports the rest of the package: the modules that take the lock sit above it.
"""
from __future__ import annotations

import threading

GLOBAL_RNG = threading.RLock()
