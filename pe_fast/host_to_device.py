"""Host tensors to the training device without stalling the host: the training loop's batch order and a task's
fresh masks, drawn on the host every step."""
from __future__ import annotations

import torch
from torch import Tensor


def upload(t: Tensor, device: torch.device) -> Tensor:
    """A host tensor on the device, without making the host wait. A plain copy to a GPU blocks until the GPU has
    run everything queued before it: drawn every step, that serialises the host's launches with the GPU's work.
    From pinned memory the copy runs in stream order while the host goes on (torch's pinned-memory allocator
    does not reuse the block before the copy is done)."""
    if torch.device(device).type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
