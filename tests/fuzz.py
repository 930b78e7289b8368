"""Seeded fuzzing of the ops: random shapes, strides, dtypes and masks against float64 references, and malformed calls
against the clear errors the contract promises. A case is a dict of small integers and flags (`draw`); its tensors are
made from its own seed (`run`), so a case is its own repro. A failing case is shrunk (sizes halved or decremented while
it still fails) and reported as `run(<case>)`.

tests/test_fuzz.py runs a quick size in the suite; PT_FUZZ_CASES=N runs N cases per op (a long run on demand).
"""
import math
import random
import types

import torch

import pytransformer as pt
from pytransformer.ops import reference

OPS = types.SimpleNamespace(**{name: getattr(pt.ops, name) for name in (
    "attention", "masked_softmax", "layer_norm", "rms_norm", "decode_attention", "kv_cache_append", "int8_linear",
    "linear")})
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16]
# Allowed |out - ref| per row, relative to the row's largest |ref| (and at least an absolute floor of the same size).
ROW_TOL = {torch.float64: 1e-9, torch.float32: 5e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}
SIZES = ("b", "h", "g", "lq", "lk", "d", "dv", "n", "rows", "t", "cap")  # the fields the shrinker may reduce


def draw(op: str, rng: random.Random) -> dict:
    """A random valid case of `op` (or, with bad set, one malformed argument)."""
    c = {"op": op, "seed": rng.randrange(2 ** 31), "dtype": rng.randrange(len(DTYPES)),
         "strided": rng.random() < 0.3, "bad": None}
    if op == "attention":
        c.update(b=rng.randint(1, 3), h=rng.randint(1, 3), g=rng.choice([1, 1, 2, 4]), lq=rng.randint(1, 80),
                 lk=rng.randint(1, 80), d=rng.randint(1, 96), dv=rng.randint(1, 96), causal=rng.random() < 0.3,
                 window=rng.choice([None, None, rng.randint(1, 20)]), lengths=rng.random() < 0.3,
                 mask=rng.choice(["none", "bool", "float", "float_inf"]))
    elif op == "masked_softmax":
        c.update(b=rng.randint(1, 3), lq=rng.randint(1, 40), lk=rng.randint(1, 300), causal=rng.random() < 0.3,
                 mask=rng.choice(["none", "bool", "float", "float_inf"]), scale=rng.choice([1.0, 0.125, 3.0]))
    elif op in ("layer_norm", "rms_norm"):
        c.update(rows=rng.randint(1, 40), n=rng.choice([1, 2, 7, 64, 333, 1024, 4099]), affine=rng.random() < 0.7,
                 offset=rng.choice([0.0, 0.0, -1e3]), spike=rng.random() < 0.2, eps=rng.choice([1e-5, 1e-6, 1e-12]))
    elif op == "decode_attention":
        c.update(b=rng.randint(1, 3), h=rng.randint(1, 3), g=rng.choice([1, 2, 4]), t=rng.randint(1, 3),
                 d=rng.randint(1, 96), dv=rng.randint(1, 96), cap=rng.randint(3, 600),
                 window=rng.choice([None, None, rng.randint(1, 50)]))
    elif op == "kv_cache_append":
        c.update(b=rng.randint(1, 3), h=rng.randint(1, 3), t=rng.randint(1, 8), d=rng.randint(1, 80),
                 dv=rng.randint(1, 80), cap=rng.randint(8, 40))
    elif op == "int8_linear":
        c.update(rows=rng.randint(1, 70), n=rng.randint(1, 300), d=rng.randint(1, 300), affine=rng.random() < 0.5)
    elif op == "linear":  # rows on both sides of the switch from the weight-streaming kernel to ATen's GEMM
        c.update(rows=rng.choice([rng.randint(1, 9), rng.randint(1, 70)]), n=rng.randint(1, 300),
                 d=rng.randint(1, 300), affine=rng.random() < 0.5)
    return c


def _randn(gen, *shape, dtype, strided):
    """Standard normal values rounded to dtype; strided: a non-contiguous view (last dim still unit-stride)."""
    if strided and len(shape) >= 2:
        big = torch.randn(*shape[:-2], shape[-2], shape[-1] + 3, generator=gen, dtype=torch.float64)
        return big[..., 1:shape[-1] + 1].to(dtype) if dtype == torch.float64 else big.to(dtype)[..., 1:shape[-1] + 1]
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def _errors(out: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per row (last dim): max |out - ref| relative to max(1, max |ref|)."""
    rows_ref, rows_out = ref.reshape(-1, ref.shape[-1]), out.reshape(-1, out.shape[-1])
    return (rows_out - rows_ref).abs().amax(-1) / rows_ref.abs().amax(-1).clamp(min=1.0)


def _row_error(out: torch.Tensor, ref: torch.Tensor, dtype, name: str, native=None, floor=None) -> str | None:
    """None when every row of out (last dim) is within ROW_TOL of ref's row (or, where PyTorch's own op in the same
    dtype, `native`, is further off on ill-conditioned rows, within 4x its worst row; or within the row's `floor`, a
    per-row error bound from its conditioning), NaN exactly where ref has NaN."""
    out, ref = out.detach().double(), ref.detach().double()
    if out.shape != ref.shape:
        return f"{name}: shape {list(out.shape)} != {list(ref.shape)}"
    if not torch.equal(out.isnan(), ref.isnan()):
        return f"{name}: NaN where the reference has none (or the reverse)"
    out, ref = out.nan_to_num(0.0), ref.nan_to_num(0.0)
    err = _errors(out, ref)
    allowed = torch.full_like(err, ROW_TOL[dtype])
    if native is not None and err.numel():  # its worst row: rounding errors of equal size land on random rows
        allowed = allowed.clamp(min=4 * _errors(native.detach().double().nan_to_num(0.0), ref).max().item())
    if floor is not None:
        allowed = torch.maximum(allowed, floor.reshape(-1))
    if err.numel() and (err > allowed).any():
        row = int((err - allowed).argmax())
        return f"{name}: row {row} off by {err[row]:.2e} (> {allowed[row]:.1e})"
    return None


def _grads_error(out, ref_out, inputs, ref_inputs, names, dtype, gen, native_out=None, native_inputs=None,
                 floors=None):
    """The gradients of <out, g> for a random g against the float64 reference's, per row (and PyTorch's own op's);
    floors(g): per-row error bounds of some gradients, by name."""
    g = torch.randn(out.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(out, inputs, g.to(out.dtype))
    ref_grads = torch.autograd.grad(ref_out, ref_inputs, g)
    native = torch.autograd.grad(native_out, native_inputs, g.to(out.dtype)) if native_out is not None else grads
    bounds = floors(g) if floors else {}
    for name, a, b, n in zip(names, grads, ref_grads, native):
        if err := _row_error(a, b, dtype, f"grad {name}", n if native_out is not None else None, bounds.get(name)):
            return err
    return None


def _norm_floors(op: str, x: torch.Tensor, eps: float):
    """A norm's per-row error bounds from the row's conditioning, in rounding units u of the computation (float32, or
    float64): out within 8 u kappa, grad x within 8 u kappa max(1, max|g| / sigma), kappa = max|x| / sigma, sigma
    the row's standard deviation (layer_norm; rms_norm: its root mean square) with eps, and grad weight (a sum over
    rows of g times out) within 8 u sum |g| kappa. The worst rows measured over ~10^5 rows of 2..333 elements, offsets
    0 and -1000, eps 1e-5..1e-12: 1.5 u kappa and 2.3 u kappa max(1, ...). (Rows of 2 elements far from their mean
    have a near-zero grad x that rounding dominates.) Returns the bound of out and a function of g giving the bounds
    of grad x and grad weight."""
    x64 = x.detach().double()
    centred = x64 - x64.mean(-1, keepdim=True) if op == "layer_norm" else x64
    sigma = (centred.pow(2).mean(-1) + eps).sqrt()
    u = 2.0 ** -52 if x.dtype == torch.float64 else 2.0 ** -23
    kappa = x64.abs().amax(-1) / sigma
    return 8 * u * kappa, lambda g: {"x": 8 * u * kappa * (g.abs().amax(-1) / sigma).clamp(min=1.0),
                                     "weight": 8 * u * (g.abs() * kappa[:, None]).sum(0).max()}


def _mask(kind: str, shape, gen, dtype):
    """None, a bool mask (True = keep) or a float mask (finite, or with -inf entries) of `shape`."""
    if kind == "bool":
        return torch.rand(*shape, generator=gen) < 0.7
    if kind == "none":
        return None
    mask = torch.randn(*shape, generator=gen, dtype=torch.float64)
    if kind == "float_inf":
        mask = mask.masked_fill(torch.rand(*shape, generator=gen) < 0.3, float("-inf"))
    return mask.to(dtype)


def _attention(c, gen, dtype):
    b, hkv, hq = c["b"], c["h"], c["h"] * c["g"]
    q = _randn(gen, b, hq, c["lq"], c["d"], dtype=dtype, strided=c["strided"])
    k = _randn(gen, b, hkv, c["lk"], c["d"], dtype=dtype, strided=c["strided"])
    v = _randn(gen, b, hkv, c["lk"], c["dv"], dtype=dtype, strided=False)
    kw = {"causal": c["causal"], "window": c["window"]}
    if c["lengths"]:
        kw["key_lengths"] = torch.randint(0, c["lk"] + 1, (b,), generator=gen)
    if c["mask"] != "none":
        kw["mask"] = _mask(c["mask"], (b, 1, c["lq"], c["lk"]) if c["mask"] == "bool" else (c["lq"], c["lk"]), gen,
                           dtype)
    return (q, k, v), ("q", "k", "v"), kw


def run(c: dict, ops=OPS) -> str | None:
    """Runs case c against `ops`; None when it passes, else what went wrong."""
    gen = torch.Generator().manual_seed(c["seed"])
    dtype = DTYPES[c["dtype"]]
    op = c["op"]
    try:
        if c["bad"] is not None:
            return _malformed(c, ops, gen, dtype)
        grad = dtype in (torch.float32, torch.float64)
        if op == "attention":
            inputs, names, kw = _attention(c, gen, dtype)
            inputs = [t.requires_grad_(grad) for t in inputs]
            out = ops.attention(*inputs, **kw)
            ref_inputs = [t.detach().double().requires_grad_(grad) for t in inputs]
            ref_kw = {k: (v.double() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in kw.items()}
            ref = reference.attention(*ref_inputs, **ref_kw)
            return _row_error(out, ref, dtype, "out") or (
                _grads_error(out, ref, inputs, ref_inputs, names, dtype, gen) if grad else None)
        if op == "masked_softmax":
            x = (_randn(gen, c["b"], c["lq"], c["lk"], dtype=dtype, strided=c["strided"]) * 4).requires_grad_(grad)
            mask = _mask(c["mask"], (c["b"], c["lq"], c["lk"]) if c["mask"] == "bool" else (c["lq"], c["lk"]), gen,
                         dtype)
            out = ops.masked_softmax(x, mask, scale=c["scale"], causal=c["causal"])
            xr = x.detach().double().requires_grad_(grad)
            mr = mask if mask is None or mask.dtype == torch.bool else mask.double()
            ref = reference.masked_softmax(xr, mr, scale=c["scale"], causal=c["causal"])
            return _row_error(out, ref, dtype, "out") or (
                _grads_error(out, ref, [x], [xr], ["scores"], dtype, gen) if grad else None)
        if op in ("layer_norm", "rms_norm"):
            x = _randn(gen, c["rows"], c["n"], dtype=torch.float64, strided=c["strided"]) * 3 + c["offset"]
            if c["spike"]:
                x[:, 0] = 1e4  # one element far from the row's mean
            x = x.to(dtype).requires_grad_(grad)
            params = [(torch.randn(c["n"], generator=gen, dtype=torch.float64).to(dtype).requires_grad_(grad))
                      for _ in range((2 if op == "layer_norm" else 1) if c["affine"] else 0)]
            out = getattr(ops, op)(x, *params, eps=c["eps"])
            ref_inputs = [t.detach().double().requires_grad_(grad) for t in [x, *params]]
            ref = getattr(reference, op)(*ref_inputs, eps=c["eps"])
            names = ["x", "weight", "bias"][:len(ref_inputs)]
            # PyTorch's own norm in the same dtype bounds the error that rounding alone makes on ill-conditioned rows
            # (|mean| >> std, or two nearly equal elements); a 1-element row's dx is exactly 0, tested elsewhere
            native_inputs = [t.detach().clone().requires_grad_(grad) for t in [x, *params]]
            native = (torch.nn.functional.layer_norm if op == "layer_norm" else torch.nn.functional.rms_norm)(
                native_inputs[0], (c["n"],), *native_inputs[1:], eps=c["eps"])
            out_floor, grad_floors = _norm_floors(op, x, c["eps"])
            return _row_error(out, ref, dtype, "out", native, out_floor) or (
                _grads_error(out, ref, [x, *params], ref_inputs, names, dtype, gen, native, native_inputs, grad_floors)
                if grad and c["n"] > 1 else None)
        if op == "decode_attention":
            b, hkv, hq, cap = c["b"], c["h"], c["h"] * c["g"], c["cap"]
            q = _randn(gen, b, hq, c["t"], c["d"], dtype=dtype, strided=c["strided"])
            k = _randn(gen, b, hkv, cap, c["d"], dtype=dtype, strided=c["strided"])
            v = _randn(gen, b, hkv, cap, c["dv"], dtype=dtype, strided=False)
            lengths = torch.randint(c["t"], cap + 1, (b,), generator=gen)
            out = ops.decode_attention(q, k, v, lengths, window=c["window"])
            ref = reference.decode_attention(q.double(), k.double(), v.double(), lengths, window=c["window"])
            return _row_error(out, ref, dtype, "out")
        if op == "kv_cache_append":
            b, h, t, cap = c["b"], c["h"], c["t"], c["cap"]
            kc = torch.randn(b, h, cap, c["d"], generator=gen).to(dtype)
            vc = torch.randn(b, h, cap, c["dv"], generator=gen).to(dtype)
            kn = _randn(gen, b, h, t, c["d"], dtype=dtype, strided=c["strided"])
            vn = _randn(gen, b, h, t, c["dv"], dtype=dtype, strided=c["strided"])
            pos = torch.randint(0, cap - t + 1, (b,), generator=gen)
            ek, ev = kc.clone(), vc.clone()
            for i in range(b):
                ek[i, :, pos[i]:pos[i] + t], ev[i, :, pos[i]:pos[i] + t] = kn[i], vn[i]
            ops.kv_cache_append(kc, vc, kn, vn, pos)
            return None if torch.equal(kc, ek) and torch.equal(vc, ev) else "caches differ from the expected writes"
        if op == "int8_linear":
            x = _randn(gen, c["rows"], c["d"], dtype=dtype, strided=c["strided"])
            w = torch.randint(-127, 128, (c["n"], c["d"]), generator=gen, dtype=torch.int8)
            scale = (torch.rand(c["n"], generator=gen) / 100).to(dtype)
            bias = torch.randn(c["n"], generator=gen).to(dtype) if c["affine"] else None
            out = ops.int8_linear(x, w, scale, bias)
            ref = reference.int8_linear(reference.int8_linear_x(x), w, scale.double(),
                                        None if bias is None else bias.double())
            return _row_error(out, ref, dtype, "out")
        if op == "linear":
            x = _randn(gen, c["rows"], c["d"], dtype=dtype, strided=c["strided"]).requires_grad_(grad)
            w = _randn(gen, c["n"], c["d"], dtype=dtype, strided=c["strided"]).requires_grad_(grad)
            params = [x, w] + ([torch.randn(c["n"], generator=gen).to(dtype).requires_grad_(grad)]
                               if c["affine"] else [])
            out = ops.linear(*params)
            ref_inputs = [t.detach().double().requires_grad_(grad) for t in params]
            ref = torch.nn.functional.linear(*ref_inputs)
            return _row_error(out, ref, dtype, "out") or (
                _grads_error(out, ref, params, ref_inputs, ["x", "weight", "bias"], dtype, gen) if grad else None)
        raise AssertionError(f"unknown op {op}")
    except Exception as e:  # noqa: BLE001 -- a valid call must not raise
        return f"raised {type(e).__name__}: {str(e)[:200]}"


# Malformed calls: the op's arguments (name -> valid value), one of them replaced by a bad value. The call must raise
# a TypeError or ValueError whose message starts with the name of an argument.
BAD_KINDS = ("not a tensor", "on meta", "wrong rank", "nan scale")


def _valid_args(c, gen, dtype) -> dict:
    op = c["op"]
    if op == "attention":
        (q, k, v), _, kw = _attention(c, gen, dtype)
        return {"q": q, "k": k, "v": v, **kw, "scale": 0.5}
    if op == "masked_softmax":
        return {"scores": torch.randn(c["b"], c["lq"], c["lk"], generator=gen).to(dtype),
                "mask": torch.rand(c["lq"], c["lk"], generator=gen) < 0.5, "scale": c["scale"]}
    if op in ("layer_norm", "rms_norm"):
        x = torch.randn(c["rows"], c["n"], generator=gen).to(dtype)
        return {"x": x, "weight": torch.ones(c["n"], dtype=dtype), "eps": c["eps"]}
    if op in ("decode_attention", "kv_cache_append"):
        b, hkv = c["b"], c["h"]
        g = c.get("g", 1)
        args = {"k_cache": torch.zeros(b, hkv, c["cap"], c["d"], dtype=dtype),
                "v_cache": torch.zeros(b, hkv, c["cap"], c["dv"], dtype=dtype)}
        if op == "decode_attention":
            return {"q": torch.randn(b, hkv * g, c["t"], c["d"]).to(dtype), **args,
                    "cache_lengths": torch.full((b,), c["t"]), "scale": 0.5}
        return {**args, "k_new": torch.randn(b, hkv, c["t"], c["d"]).to(dtype),
                "v_new": torch.randn(b, hkv, c["t"], c["dv"]).to(dtype), "positions": torch.zeros(b, dtype=torch.long)}
    if op == "linear":
        return {"x": torch.randn(c["rows"], c["d"]).to(dtype), "weight": torch.ones(c["n"], c["d"], dtype=dtype),
                "bias": torch.zeros(c["n"], dtype=dtype)}
    return {"x": torch.randn(c["rows"], c["d"]).to(dtype), "weight": torch.ones(c["n"], c["d"], dtype=torch.int8),
            "scale": torch.ones(c["n"], dtype=dtype)}


def _malformed(c, ops, gen, dtype) -> str | None:
    args = _valid_args(c, gen, dtype)
    rng = random.Random(c["seed"])
    tensors = [n for n, v in args.items() if torch.is_tensor(v)]
    kind = BAD_KINDS[c["bad"]]
    if kind == "nan scale" and "scale" in args and not torch.is_tensor(args["scale"]):
        target, args["scale"] = "scale", math.nan
    elif kind == "on meta" and len(tensors) > 1:
        target = rng.choice(tensors[1:])  # the first tensor sets the device the others are checked against
        args[target] = args[target].to("meta")
    elif kind == "wrong rank" and c["op"] in ("attention", "decode_attention", "kv_cache_append"):
        target = rng.choice([n for n in tensors if n not in ("mask",)])
        args[target] = args[target].unsqueeze(0)
    else:
        target = rng.choice(tensors)
        args[target] = args[target].tolist() if args[target].numel() < 50 else object()
    positional = {"attention": 3, "masked_softmax": 1, "layer_norm": 1, "rms_norm": 1, "decode_attention": 4,
                  "kv_cache_append": 5, "int8_linear": 3, "linear": 3}[c["op"]]
    values = list(args.values())
    call_args, call_kw = values[:positional], dict(list(args.items())[positional:])
    if c["op"] in ("layer_norm", "rms_norm"):
        call_args, call_kw = [args["x"], args["weight"]], {"eps": args["eps"]}
    try:
        getattr(ops, c["op"])(*call_args, **call_kw)
    except (TypeError, ValueError) as e:
        name = str(e).split(":")[0]
        if all(part.strip() in args for part in name.split(",")):
            return None
        return f"bad {target} ({kind}): the message does not start with an argument name: {str(e)[:120]}"
    except Exception as e:  # noqa: BLE001
        return f"bad {target} ({kind}): raised {type(e).__name__}, not TypeError/ValueError: {str(e)[:120]}"
    return f"bad {target} ({kind}): no error"


def shrink(c: dict, ops=OPS, budget: int = 60) -> dict:
    """A smaller case that still fails: each size halved, else decremented, while the failure persists."""
    progress = True
    while progress and budget > 0:
        progress = False
        for field in SIZES:
            if field not in c:
                continue
            for smaller in (c[field] // 2, c[field] - 1):
                if smaller < 1 or (field == "cap" and smaller < c.get("t", 1)) or smaller == c[field]:
                    continue
                budget -= 1
                trial = {**c, field: smaller}
                if run(trial, ops) is not None:
                    c, progress = trial, True
                    break
    return c


def fuzz(cases_per_op: int, seed: int, ops=OPS, malformed_share: float = 0.2) -> list[str]:
    """Runs cases_per_op random cases of every op; returns one line per failure: the error and a shrunk repro."""
    rng = random.Random(seed)
    failures = []
    for op in vars(OPS):
        for _ in range(cases_per_op):
            c = draw(op, rng)
            if rng.random() < malformed_share:
                c["bad"] = rng.randrange(len(BAD_KINDS))
            if (err := run(c, ops)) is not None:
                small = shrink(c, ops)
                failures.append(f"{err}\n    repro: tests.fuzz.run({small!r})")
    return failures
