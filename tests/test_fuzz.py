"""The fuzzer of tests/fuzz.py: a quick seeded run over every op (checkpoint loading included), and planted bugs that
it must catch and shrink."""
import ast
import json
import os
import types
from unittest import mock

import pytest
import torch

from pytransformer.models import checkpoint
from tests import fuzz

CASES = int(os.environ.get("PT_FUZZ_CASES", "25"))


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzz_every_op(seed):
    failures = fuzz.fuzz(CASES, seed)
    assert not failures, "\n".join(failures)


KERNEL_OPS = tuple(name for name in vars(fuzz.OPS) if name != "checkpoint")


def _planted(**bugs):
    """The ops with some replaced by buggy versions."""
    return types.SimpleNamespace(**{**vars(fuzz.OPS), **bugs})


def _last_query_row_off(q, k, v, **kw):  # a wrong fifth query row
    out = fuzz.OPS.attention(q, k, v, **kw)
    return out + (torch.arange(out.shape[-2]) == 4).to(out.dtype)[:, None] * 1e-2


def _causal_ignored_past_64_keys(scores, mask=None, *, scale=1.0, causal=False):  # a tile-boundary style bug
    return fuzz.OPS.masked_softmax(scores, mask, scale=scale, causal=causal and scores.shape[-1] <= 64)


def _mean_shift_by_first_element(x, weight=None, bias=None, eps=1e-5):  # the one-pass statistics this library had
    x64 = x.double()
    d = x64 - x64[..., :1]
    s1, s2 = d.float().sum(-1, keepdim=True), (d * d).float().sum(-1, keepdim=True)
    mean = x64[..., :1].float() + s1 / x.shape[-1]
    var = (s2 / x.shape[-1] - (s1 / x.shape[-1]) ** 2).clamp(min=0)
    y = (x.float() - mean) / torch.sqrt(var + eps)
    y = y * weight.float() if weight is not None else y
    return (y + bias.float() if bias is not None else y).to(x.dtype)


def _type_unchecked(x, weight=None, scale=None, bias=None):  # reads an attribute before checking the argument
    return fuzz.OPS.int8_linear(x, weight.contiguous(), scale, bias)


def _last_k_element_dropped(x, weight, bias=None):  # an off-by-one at the end of the dot products
    if x.shape[-1] > 1:
        x, weight = x[..., :-1], weight[..., :-1]
    return fuzz.OPS.linear(x, weight, bias)


@pytest.mark.parametrize("op, bug, field, least", [
    ("attention", {"attention": _last_query_row_off}, "lq", 5),
    ("masked_softmax", {"masked_softmax": _causal_ignored_past_64_keys}, "lk", 65),
    ("layer_norm", {"layer_norm": _mean_shift_by_first_element}, None, None),
    ("int8_linear", {"int8_linear": _type_unchecked}, "rows", 1),
    ("linear", {"linear": _last_k_element_dropped}, "d", 2),
])
def test_planted_bugs_are_found_and_shrunk(op, bug, field, least):
    """Each planted bug is found; every report is a repro that fails when run, shrunk towards the smallest size that
    shows the bug (where it has one: at least `least`, and within a factor of two of it)."""
    ops = _planted(**bug)
    failures = fuzz.fuzz(40, seed=3, ops=ops, malformed_share=0.5 if op == "int8_linear" else 0.0, names=KERNEL_OPS)
    assert failures and all(f"'op': '{op}'" in f for f in failures), failures
    for failure in failures:
        case = ast.literal_eval(failure.split("repro: tests.fuzz.run(")[1][:-1])
        assert fuzz.run(case, ops) is not None and fuzz.run(case) is None, failure
        assert field is None or least <= case[field] < 2 * least, failure
    assert not fuzz.fuzz(5, seed=3, names=KERNEL_OPS)  # the real ops pass such draws


def _config_read_unchecked(path, base):  # reads a config field before the loader has checked the file
    json.loads((path / "config.json").read_text())["vocab_size"] + 0
    return fuzz.load_checkpoint(path, base)


def _header_checks_skipped(path, base):  # dtypes and shapes no longer checked from the headers
    with mock.patch.object(checkpoint, "_check_tensors", lambda *args: None):
        return fuzz.load_checkpoint(path, base)


@pytest.mark.parametrize("bug, kinds", [
    (_config_read_unchecked, {"config_json", "config_field", "truncate", "corrupt", "rename_file"}),
    (_header_checks_skipped, {"resize_tensor", "dtype_tensor", "corrupt"}),
])
def test_planted_loader_bugs_are_found_and_shrunk(bug, kinds):
    """A loader that lets a KeyError/JSONDecodeError/TypeError out, or accepts integer and misshapen tensors, is
    caught; each report is a one-mutation repro that fails with the bug and passes without it."""
    ops = _planted(checkpoint=bug)
    failures = fuzz.fuzz(48, seed=5, ops=ops, names=("checkpoint",))
    assert failures
    for failure in failures:
        case = ast.literal_eval(failure.split("repro: tests.fuzz.run(")[1][:-1])
        assert len(case["mutations"]) == 1 and case["mutations"][0][0] in kinds, failure
        assert fuzz.run(case, ops) is not None and fuzz.run(case) is None, failure
