"""Which keys a query may see under causal masking, a sliding window and key_lengths: the one Python statement of the
masking convention, used by the references, the unfused dropout path of ops.attention and nn.MultiHeadAttention's
attention_weights (the kernels implement the same rule in C++ and CUDA)."""
import torch
from torch import Tensor


def visible_keys(lq: int, lk: int, *, causal: bool = False, window: int | None = None,
                 key_lengths: Tensor | None = None, device=None) -> Tensor | None:
    """Bool [Lq, Lk] (or [B, 1, Lq, Lk] with key_lengths), True = may attend; None when nothing is hidden.

    Query i sits at position p = i + Lk - Lq (bottom-right alignment); causal keeps keys j <= p, window=W keeps
    p - W < j <= p (and implies causal); key_lengths [B] hides keys j >= key_lengths[b]."""
    keep = None
    j = torch.arange(lk, device=device)
    if causal or window is not None:
        p = torch.arange(lq, device=device)[:, None] + (lk - lq)  # [Lq, 1]
        keep = (j <= p) & (j > p - window) if window is not None else j <= p
    if key_lengths is not None:
        real = j < key_lengths.to(device)[:, None, None, None]  # [B, 1, 1, Lk]
        keep = real if keep is None else keep & real
    return keep
