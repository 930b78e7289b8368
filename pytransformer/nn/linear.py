"""Linear: torch.nn.Linear over ops.linear."""
from torch import Tensor, nn

from .. import ops


class Linear(nn.Linear):
    """A drop-in torch.nn.Linear (same parameters, initialisation and state_dict) whose forward is ops.linear: the
    few rows of decoding stream the weight through our CPU kernel once, at memory bandwidth; many rows, float64 and
    CUDA run ATen's GEMM as F.linear does. Every linear layer of our modules and models is one."""

    def forward(self, x: Tensor) -> Tensor:
        """x [..., in_features] -> [..., out_features]."""
        return ops.linear(x, self.weight, self.bias)
