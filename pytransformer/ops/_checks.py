"""The argument checks of the C++ glue (csrc/common.h, csrc/<op>.h) for the fake kernels, with the same messages, so
that a bad call on meta tensors or under torch.compile raises the ValueError naming the argument that eager raises.
Checks that need tensor values (positions, cache lengths) stay in the kernels. Sizes may be symbolic: every
condition goes through torch._check_value."""
import math

import torch
from torch import Tensor

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def check(cond, message: str) -> None:
    """ValueError(message) unless cond. A plain bool is decided here: torch._check_value imports torch's symbolic
    shapes (sympy, some 30 MiB) on its first call, which only a symbolic condition (tracing) needs."""
    if isinstance(cond, bool):
        if not cond:
            raise ValueError(message)
        return
    torch._check_value(cond, lambda: message)


def tensors(optional: tuple = (), **named) -> None:
    """The public wrappers' first check: TypeError naming the argument that is not a tensor (None allowed for the names
    in `optional`), before any attribute of it is read."""
    for name, t in named.items():
        if not isinstance(t, Tensor) and not (t is None and name in optional):
            raise TypeError(f"{name}: expected a tensor, got {type(t).__name__}")


def float_dtype(t: Tensor, name: str) -> None:
    check(isinstance(t, Tensor), f"{name}: expected a tensor, got {type(t).__name__}")
    check(t.dtype in FLOAT_DTYPES, f"{name}: expected a float32, float16, bfloat16 or float64 tensor, got {t.dtype}")


def dim(t: Tensor, name: str, n: int, shape: str) -> None:
    check(t.dim() == n, f"{name}: expected a {n}-d tensor {shape}, got shape {list(t.shape)}")


def like(t: Tensor, name: str, ref: Tensor, ref_name: str, same_dtype: bool = True) -> None:
    """t sits on ref's device (and has its dtype when same_dtype)."""
    check(isinstance(t, Tensor), f"{name}: expected a tensor, got {type(t).__name__}")
    check(t.device == ref.device, f"{name}: expected a tensor on {ref.device} like {ref_name}, got one on {t.device}")
    check(not same_dtype or t.dtype == ref.dtype, f"{name}: expected dtype {ref.dtype} like {ref_name}, got {t.dtype}")


def sizes(t: Tensor, name: str, dims: str, expected: list) -> None:
    """t has the sizes `expected` (-1: any): "k_new: expected [B, Hkv, T, D] = [2, 4, *, 64], got [2, 4, 3, 32]"."""
    dim(t, name, len(expected), dims)
    want = "[" + ", ".join("*" if e == -1 else str(e) for e in expected) + "]"
    for e, s in zip(expected, t.shape):
        check(e == -1 or s == e, f"{name}: expected {dims} = {want}, got {list(t.shape)}")


def integer_vector(t: Tensor, name: str, ref: Tensor, ref_name: str, batch) -> None:
    """An integer index vector [B] on ref's device."""
    like(t, name, ref, ref_name, same_dtype=False)
    check(not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool,
          f"{name}: expected an integer tensor [B], got dtype {t.dtype}")
    sizes(t, name, "[B]", [batch])


def int_or_none(value, name: str) -> None:
    """The public wrappers' check of an optional int argument (a SymInt under tracing): TypeError naming it
    otherwise."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, torch.SymInt))):
        raise TypeError(f"{name}: expected an int or None, got {type(value).__name__}")


def positive_window(window) -> None:
    """csrc/attention.h: check_positive_window (attention, decode_attention, and the modules' sliding window)."""
    check(window is None or window >= 1, f"window: expected a positive number of keys, got {window}")


def finite(value: float, name: str) -> None:
    check(math.isfinite(value), f"{name}: expected a finite value, got {value}")


def feature_vector(t, name: str, x: Tensor) -> None:
    """An optional norm weight or bias [N] like x."""
    if t is None:
        return
    like(t, name, x, "x")
    check(t.dim() == 1 and t.shape[0] == x.shape[-1],
          f"{name}: expected shape [{x.shape[-1]}] (the last dim of x), got {list(t.shape)}")


def norm(x: Tensor, weight, bias, eps: float) -> None:
    """csrc/norm.h: check_norm_args."""
    float_dtype(x, "x")
    check(x.dim() >= 1 and x.shape[-1] > 0, f"x: expected shape [..., N] with N >= 1, got {list(x.shape)}")
    feature_vector(weight, "weight", x)
    feature_vector(bias, "bias", x)
    check(eps >= 0, f"eps: expected a non-negative value, got {eps}")


def same_shape(t: Tensor, name: str, ref: Tensor, ref_name: str) -> None:
    like(t, name, ref, ref_name)
    check(t.shape == ref.shape, f"{name}: expected shape {list(ref.shape)} like {ref_name}, got {list(t.shape)}")


def masked_softmax(scores: Tensor, mask, scale: float, causal: bool) -> None:
    """csrc/masked_softmax.h: check_masked_softmax_args."""
    float_dtype(scores, "scores")
    check(scores.dim() >= 1, "scores: expected a tensor of shape [..., Lk], got a 0-d tensor")
    check(not causal or scores.dim() >= 2,
          f"scores: causal=True needs shape [..., Lq, Lk], got shape {list(scores.shape)}")
    finite(scale, "scale")
    if mask is None:
        return
    check(isinstance(mask, Tensor), f"mask: expected a tensor, got {type(mask).__name__}")
    check(mask.device == scores.device, f"mask: expected a tensor on {scores.device} like scores, got one on "
          f"{mask.device}")
    check(mask.dtype in (torch.bool, scores.dtype), f"mask: expected a bool mask or a float mask of dtype "
          f"{scores.dtype} like scores, got {mask.dtype}")
    ok = mask.dim() <= scores.dim() and all(m == 1 or m == s for m, s in zip(reversed(mask.shape),
                                                                          reversed(scores.shape)))
    check(ok, f"mask: shape {list(mask.shape)} is not broadcastable to scores' shape {list(scores.shape)}")


def attention(q: Tensor, k: Tensor, v: Tensor, mask, window, key_lengths, scale: float) -> None:
    """csrc/attention.h: check_attention_args."""
    float_dtype(q, "q")
    dim(q, "q", 4, "[B, Hq, Lq, D]")
    like(k, "k", q, "q")
    like(v, "v", q, "q")
    dim(k, "k", 4, "[B, Hkv, Lk, D]")
    dim(v, "v", 4, "[B, Hkv, Lk, Dv]")
    (b, hq, lq, d), (hkv, lk) = q.shape, k.shape[1:3]
    check(d >= 1 and v.shape[3] >= 1, f"q, v: expected head dims D >= 1 and Dv >= 1, got q {list(q.shape)} and v "
          f"{list(v.shape)}")
    check(k.shape[0] == b and k.shape[3] == d and hkv >= 1, f"k: expected shape [{b}, Hkv, Lk, {d}] (B and D of q, "
          f"Hkv >= 1), got {list(k.shape)}")
    check(hq % hkv == 0, f"k: the number of query heads ({hq}) must be a multiple of the number of key/value heads "
          f"({hkv})")
    check(v.shape[0] == b and v.shape[1] == hkv and v.shape[2] == lk, f"v: expected shape [{b}, {hkv}, {lk}, Dv] "
          f"(B, Hkv and Lk of k), got {list(v.shape)}")
    positive_window(window)
    finite(scale, "scale")
    if mask is not None:
        like(mask, "mask", q, "q", same_dtype=False)
        check(mask.dtype == torch.bool or mask.is_floating_point(), "mask: expected a bool (True = may attend) or "
              f"floating (added to the scores) tensor, got {mask.dtype}")
        full = (b, hq, lq, lk)
        ok = mask.dim() <= 4 and all(m == 1 or m == f for m, f in zip(reversed(mask.shape), reversed(full)))
        check(ok, f"mask: expected a shape that broadcasts to [B, Hq, Lq, Lk] = {list(full)}, got {list(mask.shape)}")
    if key_lengths is not None:
        like(key_lengths, "key_lengths", q, "q", same_dtype=False)
        check(not key_lengths.is_floating_point() and not key_lengths.is_complex() and key_lengths.dtype != torch.bool,
              f"key_lengths: expected an integer tensor, got {key_lengths.dtype}")
        check(key_lengths.dim() == 1 and key_lengths.shape[0] == b,
              f"key_lengths: expected shape [{b}] (one length per batch row), got {list(key_lengths.shape)}")


def kv_cache_append(k_cache: Tensor, v_cache: Tensor, k_new: Tensor, v_new: Tensor, positions: Tensor,
                    max_position=None) -> None:
    """csrc/kv_cache_append.h: check_kv_cache_append_args (memory overlap is checked in eager only)."""
    float_dtype(k_cache, "k_cache")
    dim(k_cache, "k_cache", 4, "[B, Hkv, capacity, D]")
    b, h, cap, d = k_cache.shape
    like(v_cache, "v_cache", k_cache, "k_cache")
    sizes(v_cache, "v_cache", "[B, Hkv, capacity, Dv]", [b, h, cap, -1])
    like(k_new, "k_new", k_cache, "k_cache")
    sizes(k_new, "k_new", "[B, Hkv, T, D]", [b, h, -1, d])
    like(v_new, "v_new", k_cache, "k_cache")
    sizes(v_new, "v_new", "[B, Hkv, T, Dv]", [b, h, k_new.shape[2], v_cache.shape[3]])
    integer_vector(positions, "positions", k_cache, "k_cache", b)
    if max_position is not None:  # check_append_bound
        t = k_new.shape[2]
        check(0 <= max_position <= cap - t, f"max_position: a row at position {max_position} would write cache "
              f"positions {max_position}..{max_position + t - 1}, outside the cache capacity {cap} (expected "
              f"0 <= max_position <= capacity - T = {cap - t})")


def decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_lengths: Tensor, scale: float,
                     window, max_length=None) -> None:
    """csrc/decode_attention.h: check_decode_attention_args."""
    float_dtype(q, "q")
    dim(q, "q", 4, "[B, Hq, T, D]")
    b, hq, t, d = q.shape
    check(t >= 1, f"q: expected [B, Hq, T, D] with T >= 1 new tokens, got {list(q.shape)}")
    like(k_cache, "k_cache", q, "q")
    sizes(k_cache, "k_cache", "[B, Hkv, capacity, D]", [b, -1, -1, d])
    hkv, cap = k_cache.shape[1:3]
    like(v_cache, "v_cache", q, "q")
    sizes(v_cache, "v_cache", "[B, Hkv, capacity, Dv]", [b, hkv, cap, -1])
    check(hkv >= 1 and hq % hkv == 0, f"q: the number of query heads Hq = {hq} must be a multiple of the number of "
          f"cache heads Hkv = {hkv}")
    integer_vector(cache_lengths, "cache_lengths", q, "q", b)
    positive_window(window)
    finite(scale, "scale")
    check(max_length is None or 0 <= max_length <= cap,  # check_length_bound
          f"max_length: expected 0 <= max_length <= capacity = {cap}, got {max_length}")


def linear(x: Tensor, weight: Tensor, bias) -> None:
    """csrc/linear.h: check_linear_args."""
    float_dtype(x, "x")
    check(x.dim() >= 1, "x: expected a tensor [..., K], got a 0-d tensor")
    like(weight, "weight", x, "x")
    check(weight.dim() == 2 and weight.shape[1] == x.shape[-1], f"weight: expected [N, K] with K = {x.shape[-1]} "
          f"(the last dim of x), got shape {list(weight.shape)}")
    if bias is not None:
        like(bias, "bias", x, "x")
        check(bias.dim() == 1 and bias.shape[0] == weight.shape[0], f"bias: expected shape [N] = [{weight.shape[0]}] "
              f"(the rows of weight), got {list(bias.shape)}")


def known_x_bits(x_bits: int) -> None:
    """csrc/int8_linear.h: check_x_bits (int8_linear, and the int8 modules' x_bits)."""
    check(x_bits in (8, 16), f"x_bits: expected 8 or 16, got {x_bits}")


def int8_linear(x: Tensor, weight: Tensor, scale: Tensor, bias, x_bits: int) -> None:
    """csrc/int8_linear.h: check_int8_linear_args."""
    known_x_bits(x_bits)
    float_dtype(x, "x")
    check(x.dim() >= 1, "x: expected a tensor [..., K], got a 0-d tensor")
    like(weight, "weight", x, "x", same_dtype=False)
    check(weight.dtype == torch.int8, f"weight: expected an int8 tensor [N, K], got dtype {weight.dtype}")
    check(weight.dim() == 2 and weight.shape[1] == x.shape[-1], f"weight: expected int8 [N, K] with K = "
          f"{x.shape[-1]} (the last dim of x), got shape {list(weight.shape)}")
    for t, name in ((scale, "scale"), (bias, "bias")):
        if t is None:
            continue
        float_dtype(t, name)
        like(t, name, x, "x", same_dtype=False)
        check(t.dim() == 1 and t.shape[0] == weight.shape[0], f"{name}: expected shape [N] = [{weight.shape[0]}] "
              f"(the rows of weight), got {list(t.shape)}")
