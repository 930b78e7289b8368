"""Seeded fuzzing of the ops: random shapes, strides, dtypes and masks against float64 references, and malformed calls
against the clear errors the contract promises. A case is a dict of small integers and flags (`draw`); its tensors are
made from its own seed (`run`), so a case is its own repro. A failing case is shrunk (sizes halved or decremented while
it still fails) and reported as `run(<case>)`.

The "checkpoint" op fuzzes loading: a tiny save_pretrained folder (Llama, sharded GPT-2 or BERT, built once with
transformers) damaged by a few mutations (files truncated, corrupted or renamed; tensors renamed, resized, dropped,
duplicated or made integer; config fields deleted or set to wrong values; config.json or the index broken) must load
into a model that runs, or raise ValueError/FileNotFoundError naming a file of the folder; a mutation that makes the
folder wrong (MUST_FAIL) must raise. A failing case is shrunk by dropping mutations.

tests/test_fuzz.py runs a quick size in the suite; PT_FUZZ_CASES=N runs N cases per op (a long run on demand).
"""
import atexit
import json
import math
import random
import shutil
import tempfile
import types
from pathlib import Path

import torch

import pytransformer as pt
from pytransformer.ops import reference


def load_checkpoint(path, base: str):
    """The model of a checkpoint folder made from base folder `base` (BERT: an EncoderModel, Marian: a
    Seq2SeqTransformer, else a DecoderLM)."""
    cls = {"bert": pt.models.EncoderModel, "marian": pt.models.Seq2SeqTransformer}.get(base, pt.models.DecoderLM)
    return cls.from_pretrained(path)


OPS = types.SimpleNamespace(**{name: getattr(pt.ops, name) for name in (
    "attention", "masked_softmax", "layer_norm", "rms_norm", "decode_attention", "kv_cache_append", "int8_linear",
    "linear")}, checkpoint=load_checkpoint)
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
    elif op == "checkpoint":
        c = {"op": op, "seed": c["seed"], "base": rng.choice(list(BASES)),
             "mutations": [_draw_mutation(rng) for _ in range(rng.randint(1, 3))]}
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
    if c["op"] == "checkpoint":
        return _checkpoint_case(c, ops)
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
    """A smaller case that still fails: each size halved, else decremented (a checkpoint case: each mutation dropped),
    while the failure persists."""
    if c["op"] == "checkpoint":
        return _shrink_mutations(c, ops)
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


def fuzz(cases_per_op: int, seed: int, ops=OPS, malformed_share: float = 0.2, names=tuple(vars(OPS))) -> list[str]:
    """Runs cases_per_op random cases of every op (of those in `names`); returns one line per failure: the error and
    a shrunk repro."""
    rng = random.Random(seed)
    failures = []
    for op in names:
        for _ in range(cases_per_op):
            c = draw(op, rng)
            if rng.random() < malformed_share and op != "checkpoint":
                c["bad"] = rng.randrange(len(BAD_KINDS))
            if (err := run(c, ops)) is not None:
                small = shrink(c, ops)
                failures.append(f"{err}\n    repro: tests.fuzz.run({small!r})")
    return failures


# Checkpoint folders. A mutation is a list [kind, i, j] of small values: i picks a file, tensor or config field (modulo
# their count), j a variant. Tensor edits keep a sharded folder's weight_map in step, as a careful user would.
BASES = {"llama": "model.", "qwen3": "model.", "phi3": "model.", "gemma3": "model.", "gpt2": "transformer.",
         "bert": "bert.", "marian": "model."}  # -> the backbone prefix
FIELDS = ("vocab_size", "hidden_size", "n_embd", "num_attention_heads", "n_head", "num_hidden_layers", "n_layer",
          "intermediate_size", "max_position_embeddings", "n_positions", "num_key_value_heads", "model_type",
          "tie_word_embeddings", "rms_norm_eps", "layer_norm_epsilon", "rope_theta", "hidden_act", "type_vocab_size",
          "n_inner", "rope_parameters", "head_dim", "d_model", "encoder_layers", "decoder_layers",
          "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim",
          "activation_function", "scale_embedding", "share_encoder_decoder_embeddings", "decoder_vocab_size",
          "layer_types", "sliding_window", "query_pre_attn_scalar", "hidden_activation", "sliding_window_pattern")
DELETE = "<deleted>"
VALUES = (DELETE, None, 0, -1, "64", 3e8, 10 ** 10, [1], {}, True, 1.5, "llama", "bert", 16, 2)
MUTATIONS = {  # kind -> number of variants j
    "truncate": 1000, "corrupt": 1000, "rename_file": 1, "rename_tensor": 2, "resize_tensor": 3, "drop_tensor": 1,
    "duplicate_tensor": 2, "dtype_tensor": 4, "config_field": len(VALUES), "config_json": 4, "index": 4}
NEEDED_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json", "model-")  # name prefixes
TENSOR_DTYPES = (torch.int64, torch.bool, torch.float16, torch.bfloat16)  # the first two must be refused


def _draw_mutation(rng: random.Random) -> list:
    kind = rng.choice(list(MUTATIONS))
    return [kind, rng.randrange(64), rng.randrange(MUTATIONS[kind])]


_BASE_DIRS: dict[str, Path] = {}


def _base_folder(base: str) -> Path:
    """The save_pretrained folder of a tiny random model, built once per process: Llama (untied head, GQA), Qwen3
    (tied, q/k norms, heads of 8: twice hidden_size / heads), Phi-3 (fused q|k|v and gate|up, a window), Gemma 3 (a
    windowed and a full layer), GPT-2 (in several shards), BERT or Marian."""
    if base not in _BASE_DIRS:
        import transformers
        small = {"vocab_size": 50, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "max_position_embeddings": 32}
        model = {"llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
                     **small, num_key_value_heads=2, tie_word_embeddings=False)),
                 "qwen3": lambda: transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
                     **small, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)),
                 "phi3": lambda: transformers.Phi3ForCausalLM(transformers.Phi3Config(
                     **small, num_key_value_heads=2, sliding_window=16, pad_token_id=0, bos_token_id=None,
                     eos_token_id=None)),
                 "gemma3": lambda: transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(
                     **small, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8, sliding_window=4,
                     layer_types=["sliding_attention", "full_attention"], pad_token_id=0, bos_token_id=None,
                     eos_token_id=None)),
                 "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
                     vocab_size=50, n_embd=16, n_layer=2, n_head=4, n_positions=32, bos_token_id=None,
                     eos_token_id=None)),
                 "bert": lambda: transformers.BertModel(transformers.BertConfig(**small)),
                 "marian": lambda: transformers.MarianMTModel(transformers.MarianConfig(
                     vocab_size=50, d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                     pad_token_id=49, decoder_start_token_id=49, scale_embedding=True))}[base]
        with torch.random.fork_rng():
            torch.manual_seed(0)
            model = model()
        path = Path(tempfile.mkdtemp(prefix=f"fuzz_{base}_"))
        atexit.register(shutil.rmtree, path, True)
        model.save_pretrained(path, max_shard_size="8KB" if base == "gpt2" else "1GB")
        _BASE_DIRS[base] = path
    return _BASE_DIRS[base]


def _files(path: Path) -> list[Path]:
    return sorted(f for f in path.iterdir() if f.is_file())


def _needed(f: Path) -> bool:
    return f.name.startswith(NEEDED_FILES) and not f.name.endswith(".old")


def _tensor_files(path: Path) -> list[tuple[Path, str]]:
    """(file, tensor name) of every tensor in the folder's readable safetensors files, sorted."""
    from safetensors import safe_open
    found = []
    for f in _files(path):
        if f.suffix == ".safetensors":
            try:
                with safe_open(str(f), "pt") as handle:
                    found += [(f, name) for name in handle.keys()]
            except Exception:  # noqa: BLE001 -- a file an earlier mutation made unreadable is left alone
                continue
    return sorted(found)


def _edit_tensors(f: Path, edit) -> None:
    """Rewrite safetensors file f as edit(its name -> tensor dict) leaves it."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(f))
    edit(tensors)
    save_file(tensors, str(f), metadata={"format": "pt"})


def _edit_json(f: Path, edit) -> bool:
    """Rewrite JSON file f (if it parses as an object) as edit(its dict) leaves it; whether it did."""
    try:
        d = json.loads(f.read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(d, dict):
        return False
    edit(d)
    f.write_text(json.dumps(d))
    return True


def _relist(path: Path, old: str | None, new: str | None, shard: str) -> None:
    """Keep the index's weight_map in step with a tensor renamed (old -> new), dropped (new None) or added (old
    None) in `shard`."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        def edit(d):
            weight_map = d.get("weight_map")
            if isinstance(weight_map, dict):
                weight_map.pop(old, None)
                if new is not None:
                    weight_map[new] = shard
        _edit_json(index, edit)


def _other_name(name: str, prefix: str) -> str:
    """The same tensor under the other spelling: with the backbone prefix removed, or added."""
    return name.removeprefix(prefix) if name.startswith(prefix) else prefix + name


def _mutate(path: Path, base: str, mutation: list):
    """Apply one mutation to the folder. None: the folder may still load; else a function of the (file, tensor name)
    pairs present after every mutation, whether the folder is still wrong (a later mutation can undo a duplicate or a
    drop)."""
    kind, i, j = mutation
    if kind in ("truncate", "corrupt", "rename_file"):
        files = _files(path)
        wrong = _mutate_file(files[i % len(files)], kind, i, j)
    elif kind in ("config_json", "config_field"):
        wrong = _mutate_config(path / "config.json", kind, i, j)
    elif kind == "index":
        wrong = _mutate_index(path, i, j)
    else:
        tensors = _tensor_files(path)
        return _mutate_tensor(path, tensors, BASES[base], kind, i, j) if tensors else None
    return (lambda present: True) if wrong else None


def _mutate_file(f: Path, kind: str, i: int, j: int) -> bool:
    """Truncate f to j/1000 of its length, change its byte at j/1000, or rename it; whether the load must fail."""
    data, at = f.read_bytes(), len(f.read_bytes()) * j // 1000
    if kind == "truncate":
        f.write_bytes(data[:at])
        return _needed(f) and bool(data[at:].strip())  # more than a JSON file's final newline
    if kind == "corrupt":
        f.write_bytes(data[:at] + bytes([(data[at] + 1 + i) % 256]) + data[at + 1:] if data else data)
        return False
    f.rename(f.with_name(f.name + ".old"))
    return _needed(f)


# config.json texts that are not a JSON object, whatever other CONFIG_TEXTS did before
CONFIG_TEXTS = (lambda t: b"[" + t + b"]", lambda t: t + b"}", lambda t: b"null", lambda t: t[:len(t) // 2])


def _mutate_config(f: Path, kind: str, i: int, j: int) -> bool:
    """Make config.json invalid (config_json: must fail), or set or delete one field (may load)."""
    if kind == "config_json":
        if f.is_file():
            f.write_bytes(CONFIG_TEXTS[j](f.read_bytes()))
        return f.is_file()
    value, field = VALUES[j], FIELDS[i % len(FIELDS)]
    _edit_json(f, lambda d: d.pop(field, None) if value is DELETE else d.update({field: value}))
    return False


def _mutate_index(path: Path, i: int, j: int) -> bool:
    """Break a sharded folder's weight_map: removed, a list, or one tensor listed in a missing or another shard."""
    index = path / "model.safetensors.index.json"
    shards = sorted({g.name for g, _ in _tensor_files(path)})

    def edit(d):
        weight_map = d.get("weight_map")
        if j == 0:
            d.pop("weight_map", None)
        elif j == 1:
            d["weight_map"] = list(weight_map or [])
        elif isinstance(weight_map, dict) and weight_map:
            name = sorted(weight_map)[i % len(weight_map)]
            others = [s for s in shards if s != weight_map[name]]
            weight_map[name] = "missing.safetensors" if j == 2 or not others else others[i % len(others)]
    return index.is_file() and _edit_json(index, edit)


def _holds(f: Path, name: str):
    """Whether file f still holds tensor `name` (as a function of the pairs present)."""
    return lambda present: (f, name) in present


def _lacks(name: str, prefix: str):
    """Whether no spelling of tensor `name` is left (as a function of the pairs present)."""
    return lambda present: all(n.removeprefix(prefix) != name.removeprefix(prefix) for _, n in present)


def _mutate_tensor(path: Path, tensors: list, prefix: str, kind: str, i: int, j: int):
    """Rename, resize, drop, duplicate or retype the i-th tensor; as _mutate returns (a changed tensor makes the folder
    wrong while it is there, a drop while no other spelling of the name is, a duplicate while both copies are)."""
    f, name = tensors[i % len(tensors)]
    if kind == "rename_tensor":
        new = name + ".x" if j == 0 else name.replace(".weight", ".w")
        if new == name:
            return None
        _edit_tensors(f, lambda t: t.update({new: t.pop(name)}))
        _relist(path, name, new, f.name)
        return lambda present: _holds(f, new)(present) or _lacks(name, prefix)(present)
    if kind == "resize_tensor":
        def resize(t):
            shape = list(t[name].shape)
            d = i % len(shape)
            shape[d] = [shape[d] + 1, max(shape[d] - 1, 0), 2 * shape[d] + 1][j]
            t[name] = torch.randn(shape).to(t[name].dtype)
        _edit_tensors(f, resize)
        return _holds(f, name)
    if kind == "drop_tensor":
        _edit_tensors(f, lambda t: t.pop(name))
        _relist(path, name, None, f.name)
        return _lacks(name, prefix)
    if kind == "duplicate_tensor":
        others = sorted({g for g, _ in tensors} - {f})
        if j == 0 or not others:  # under the other spelling of its name, in the same file
            _edit_tensors(f, lambda t: t.update({_other_name(name, prefix): t[name].clone()}))
            _relist(path, None, _other_name(name, prefix), f.name)
            return lambda present: _holds(f, name)(present) and _holds(f, _other_name(name, prefix))(present)
        value = _read_tensor(f, name)  # the same name in another shard; the index still lists the first
        _edit_tensors(others[0], lambda t: t.update({name: value}))
        return lambda present: _holds(f, name)(present) and _holds(others[0], name)(present)
    if kind == "dtype_tensor":
        dtype = TENSOR_DTYPES[j]
        _edit_tensors(f, lambda t: t.update({name: (t[name] > 0 if dtype == torch.bool else t[name]).to(dtype)}))
        return _holds(f, name) if j < 2 else None


def _read_tensor(f: Path, name: str) -> torch.Tensor:
    from safetensors import safe_open
    with safe_open(str(f), "pt") as handle:
        return handle.get_tensor(name)


def _checkpoint_case(c: dict, ops) -> str | None:
    """Mutate a copy of the base folder and load it: None when the load is correct (a model whose forward runs) or
    fails as the contract says (ValueError/FileNotFoundError naming a file of the folder), and no mutation that must
    fail was accepted; else what went wrong."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        shutil.copytree(_base_folder(c["base"]), path)
        witnesses = [(m, _mutate(path, c["base"], m)) for m in c["mutations"]]
        present = set(_tensor_files(path))
        must_fail = [m for m, wrong in witnesses if wrong is not None and wrong(present)]
        try:
            model = ops.checkpoint(path, c["base"])
        except (ValueError, FileNotFoundError) as e:
            return None if str(path) in str(e) else f"{type(e).__name__} not naming a file of the folder: {e!s:.200}"
        except Exception as e:  # noqa: BLE001 -- only the two types above may come out
            return f"raised {type(e).__name__}, not ValueError/FileNotFoundError: {str(e)[:200]}"
        if must_fail:
            return f"loaded although {must_fail[0]} makes the folder wrong"
        try:
            with torch.no_grad():
                ids = torch.arange(min(3, model.config.max_len))[None] % model.config.vocab_size  # Marian: any max_len
                out = model(ids, ids) if c["base"] == "marian" else model(ids)
        except Exception as e:  # noqa: BLE001
            return f"loaded, but the forward raised {type(e).__name__}: {str(e)[:200]}"
        return None if out.shape[:2] == ids.shape else f"loaded, but the forward gave shape {list(out.shape)}"


def _signature(failure: str | None) -> str | None:
    """The kind of a failure: its message up to the first colon (the exception type, or the mutation accepted)."""
    return None if failure is None else failure.split(":")[0]


def _shrink_mutations(c: dict, ops) -> dict:
    """Drop mutations one at a time while the case still fails the same way."""
    kind, i = _signature(run(c, ops)), 0
    while i < len(c["mutations"]) and len(c["mutations"]) > 1:
        trial = {**c, "mutations": c["mutations"][:i] + c["mutations"][i + 1:]}
        if _signature(run(trial, ops)) == kind:
            c = trial
        else:
            i += 1
    return c
