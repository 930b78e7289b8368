"""compiled_step: a model's cached decoding step as one graph compiled by Inductor, run without Dynamo.

The step, model(tok, cache=cache)[:, -1], is traced once by make_fx over fake inputs whose only dynamic size is the
cache's capacity, so one graph serves every prompt length and max_new_tokens; Inductor compiles it (on the CPU with
its C++ wrapper, so no Python runs between kernels). A step then calls the compiled code directly: there are no
per-call guard checks or argument gathering, which torch.compile's Dynamo front end spends on every call (about
0.6 ms a token for a 12-layer model with 2 CPU threads, 8% of a bfloat16 step).

In their place, each compiled_step call (once per generation) checks what a graph was traced for: the model's
parameters and buffers (the same tensor objects, used as constants, so in-place updates are seen and a replaced
tensor means new graphs), its train mode, the shapes, dtypes, devices and layout of the token and cache tensors
apart from the capacity, and the capacity against the shape guards recorded by tracing (a rolling cache, whose
capacity is the attention's window, gets its own graph). Python attributes that the forward reads, such as a
config's fields, are traced as constants: change them and build a new model. Every batch size has its own graph.
"""
import itertools
import weakref
from typing import Callable, NamedTuple

import torch
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP, DimDynamic, ShapeEnv, StatelessSymbolicContext

from ..nn import KVCache

_CAPACITY = 2  # the dynamic dimension of the [B, Hkv, capacity, D] cache tensors
_FIRST_KV = 2  # the index of the first cache tensor in the step's inputs (_inputs)


def decode_step(model: nn.Module, tok: Tensor, cache: KVCache) -> Tensor:
    """The last-position logits [B, vocab] of the next tokens tok [B, 1] of every row, appended to the cache."""
    return model(tok, cache=cache)[:, -1]


class _Graph(NamedTuple):
    layout: tuple  # the inputs it was traced for, apart from the capacity (_layout)
    fits: Callable[[list], bool]  # whether inputs meet the shape guards on the capacity (_guards)
    run: Callable


# model -> (its tensors' identities (_tensors), the graphs traced with them): a graph holds the tensors as constants,
# so graphs of replaced tensors go with them.
_GRAPHS = weakref.WeakKeyDictionary()


def _inputs(tok: Tensor, cache: KVCache) -> list:
    return [tok, cache.lengths, *cache.k, *cache.v]


def _tensors(model: nn.Module) -> tuple:
    return tuple((id(t), t.shape, t.dtype, t.device) for t in itertools.chain(model.parameters(), model.buffers()))


def _layout(model: nn.Module, inputs: list) -> tuple:
    """The train mode, and each input's shape, dtype, device and contiguity, the capacity of the cache tensors only as
    whether it is below 2 (sizes 0 and 1 are traced as constants)."""
    def shape(i, t):
        if i < _FIRST_KV:
            return tuple(t.shape)
        return (*t.shape[:_CAPACITY], t.shape[_CAPACITY] < 2, *t.shape[_CAPACITY + 1:])
    return model.training, tuple((shape(i, t), t.dtype, t.device, t.is_contiguous()) for i, t in enumerate(inputs))


def _trace(model: nn.Module, cache: KVCache, inputs: list) -> _Graph:
    shape_env = ShapeEnv()
    mode = FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)  # the model's tensors stay real

    def fake(i, t):
        sizes = [DimDynamic.DUCK if i >= _FIRST_KV and d == _CAPACITY else DimDynamic.STATIC for d in range(t.dim())]
        return mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=sizes))

    placeholders = [fake(i, t) for i, t in enumerate(inputs)]
    n = len(cache.k)

    def step(tok, lengths, *kv):
        view = KVCache.__new__(KVCache)
        view.__dict__.update(cache.__dict__, lengths=lengths, k=list(kv[:n]), v=list(kv[n:]), max_length=None)
        return decode_step(model, tok, view)

    with torch.no_grad():
        gm = make_fx(step, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*placeholders)
        run = torch._inductor.compile(gm, inputs, options=_options(inputs[0].device))
    return _Graph(_layout(model, inputs), _guards(shape_env, placeholders), run)


def _options(device: torch.device) -> dict:
    """Inductor's options: on the CPU its C++ wrapper; everywhere without size_asserts, the wrapper's check of every
    input's and op output's sizes and strides against the traced ones, which formats its error message's strings
    before checking (on the CPU some 50 us a step of a 12-layer model). The inputs are checked once per generate
    call instead (_layout, _guards), and the ops' outputs match their fake kernels (tests/ops: opcheck)."""
    return {"size_asserts": False} | ({"cpp_wrapper": True} if device.type == "cpu" else {})


def _guards(shape_env: ShapeEnv, placeholders: list) -> Callable[[list], bool]:
    """Whether inputs meet the shape guards recorded while tracing and compiling: the ShapeEnv's own guard
    expression over the placeholders (what evaluate_guards_for_args evaluates), compiled once, as producing and
    compiling it from its text took 2.8 ms a generate call (a 12-layer model)."""
    code = shape_env.produce_guards_expression(placeholders)
    if not code:
        return lambda inputs: True
    expression = compile(code, "<compiled_step guards>", "eval")
    return lambda inputs: eval(expression, SYMPY_INTERP, {"L": {f"t{i}": t for i, t in enumerate(inputs)}})


def compiled_step(model: nn.Module, cache: KVCache) -> Callable[[Tensor], Tensor]:
    """decode_step(model, tok, cache) as one compiled graph (see the module's docstring): the returned step(tok)
    traces and compiles it on its first call unless a graph of this model fits (tens of seconds; Inductor needs a C++
    compiler on the CPU), and from then on runs it directly with the same cache tensors and tokens of tok's shape.
    The cache's host-side length bound is dropped, as the compiled kernels read the lengths (KVCache). A cache with
    cross-attention entries is a ValueError: the graph would hold them as constants."""
    if cache.cross_k is not None:
        raise ValueError("cache: compiled_step takes a self-attention cache (no cross-attention entries)")
    cache.max_length = None
    inputs, run = [], None

    def step(tok: Tensor) -> Tensor:
        nonlocal run
        if run is None:
            inputs.extend(_inputs(tok, cache))
            run = _graph(model, cache, inputs).run
        inputs[0] = tok
        return run(*inputs)
    return step


def _graph(model: nn.Module, cache: KVCache, inputs: list) -> _Graph:
    tensors = _tensors(model)
    if model not in _GRAPHS or _GRAPHS[model][0] != tensors:
        _GRAPHS[model] = tensors, []
    graphs, layout = _GRAPHS[model][1], _layout(model, inputs)
    for g in graphs:
        if g.layout == layout and g.fits(inputs):
            return g
    graphs.append(_trace(model, cache, inputs))
    return graphs[-1]
