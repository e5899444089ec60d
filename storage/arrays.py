"""numpy or torch for the replay bookkeeping.

The bookkeeping (positions, sizes, priorities, episode bounds, use counts) is a few dozen
element-wise operations on small index batches per call. On a CPU it runs on numpy views of
the buffer's tensors (about a microsecond per operation against several for torch); on any
other device it runs on the tensors themselves. Both libraries share the operator syntax the
bookkeeping uses, so one code path serves both.

``TORCH_ON_CPU`` makes buffers built while it is set take the torch path on a CPU as well: the
tests run the path a GPU takes on machines that have none (CI has none).
"""

from __future__ import annotations

import torch

TORCH_ON_CPU = False


def numpy_views(device) -> bool:
    """True where the bookkeeping of a buffer on ``device`` runs on numpy views."""
    return torch.device(device).type == "cpu" and not TORCH_ON_CPU
