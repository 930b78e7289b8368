"""Smoke test of an installed pytransformer (make install-check), run from outside the checkout: the package imports from site-packages,
an op on the CPU matches PyTorch, and a layer compiles with torch.compile(fullgraph=True) and matches eager."""
import torch
import torch.nn.functional as F

import pytransformer as pt

assert "site-packages" in pt.__file__, f"imported from {pt.__file__}, not from the installed package"
torch.manual_seed(0)
x = torch.randn(8, 64)
torch.testing.assert_close(pt.ops.layer_norm(x), F.layer_norm(x, (64,)))
q, k, v = (torch.randn(2, 4, 16, 32) for _ in range(3))
torch.testing.assert_close(pt.ops.attention(q, k, v, causal=True),
                           F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-5, rtol=1e-5)
layer = pt.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, norm="pre").eval()
h = torch.randn(2, 10, 64)
with torch.no_grad():
    torch.testing.assert_close(torch.compile(layer, fullgraph=True)(h, causal=True), layer(h, causal=True))
print(f"smoke test passed: pytransformer from {pt.__file__}, CPU ISA {pt._C.cpu_isa()}")
