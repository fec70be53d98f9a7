"""Length-aware pooling of a variable number of frames into a fixed number of tokens."""

from __future__ import annotations

import torch


def pool_to_tokens(features: torch.Tensor, lengths: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """Average each item's valid frames over ``num_tokens`` contiguous segments.

    Args:
        features: ``(N, T, D)`` frames, padded after ``lengths``.
        lengths: ``(N,)`` number of valid frames per item (at least 1).
        num_tokens: segments per item.

    Returns:
        ``(N, num_tokens, D)``. Segment ``k`` of an item with ``n`` frames covers frames
        ``[floor(k n / K), max(floor(k n / K) + 1, ceil((k + 1) n / K)))``, so an item
        shorter than ``num_tokens`` repeats frames instead of producing empty segments.
    """
    n, t, _ = features.shape
    lengths = lengths.to(features.device).clamp(min=1, max=t)
    k = torch.arange(num_tokens, device=features.device)
    start = torch.div(k[None, :] * lengths[:, None], num_tokens, rounding_mode="floor")  # (N, K)
    end = torch.div((k[None, :] + 1) * lengths[:, None] + num_tokens - 1, num_tokens, rounding_mode="floor")
    end = torch.maximum(end, start + 1)
    frame = torch.arange(t, device=features.device)
    weights = ((frame[None, None, :] >= start[..., None]) & (frame[None, None, :] < end[..., None])).to(features.dtype)
    weights = weights / weights.sum(-1, keepdim=True)  # (N, K, T)
    return torch.bmm(weights, features)
