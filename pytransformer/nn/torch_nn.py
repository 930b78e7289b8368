"""Import of torch.nn.TransformerEncoderLayer / TransformerDecoderLayer weights into our layers (the classmethods
TransformerEncoderLayer.from_torch / TransformerDecoderLayer.from_torch, which pass their class as `cls`)."""
import torch.nn.functional as F
from torch import nn



def _settings(layer) -> dict:
    attn = layer.self_attn
    if not attn._qkv_same_embed_dim:
        raise ValueError("layer: self_attn with kdim/vdim different from embed_dim is not supported")
    act = layer.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        activation = "relu"
    elif act is F.gelu or (isinstance(act, nn.GELU) and act.approximate == "none"):
        activation = "gelu"
    else:
        raise ValueError(f"layer: activation {act} is not supported (relu or gelu)")
    return {"d_model": attn.embed_dim, "n_heads": attn.num_heads, "d_ff": layer.linear1.out_features,
            "dropout": layer.dropout.p, "activation": activation, "norm": "pre" if layer.norm_first else "post",
            "eps": layer.norm1.eps, "bias": layer.linear1.bias is not None,
            "device": layer.linear1.weight.device, "dtype": layer.linear1.weight.dtype}


def _attention(prefix: str, attn: nn.MultiheadAttention) -> dict:
    out = {f"{prefix}.qkv_proj.weight": attn.in_proj_weight, f"{prefix}.out_proj.weight": attn.out_proj.weight}
    if attn.in_proj_bias is not None:
        out |= {f"{prefix}.qkv_proj.bias": attn.in_proj_bias, f"{prefix}.out_proj.bias": attn.out_proj.bias}
    return out


def _module(prefix: str, m: nn.Module) -> dict:
    return {f"{prefix}.{name}": p for name, p in m.named_parameters()}


def encoder_layer_from_torch(cls, layer: nn.TransformerEncoderLayer):
    """A TransformerEncoderLayer with the settings and weights of a torch.nn.TransformerEncoderLayer."""
    ours = cls(**_settings(layer))
    state = (_attention("self_attn", layer.self_attn) | _module("ff.fc1", layer.linear1) | _module("ff.fc2", layer.linear2)
             | _module("res_attn.norm", layer.norm1) | _module("res_ff.norm", layer.norm2))
    ours.load_state_dict(state)
    return ours.train(layer.training)


def decoder_layer_from_torch(cls, layer: nn.TransformerDecoderLayer):
    """A TransformerDecoderLayer (with cross-attention) with the settings and weights of a torch.nn one."""
    ours = cls(**_settings(layer))
    state = (_attention("self_attn", layer.self_attn) | _attention("cross_attn", layer.multihead_attn)
             | _module("ff.fc1", layer.linear1) | _module("ff.fc2", layer.linear2) | _module("res_self.norm", layer.norm1)
             | _module("res_cross.norm", layer.norm2) | _module("res_ff.norm", layer.norm3))
    ours.load_state_dict(state)
    return ours.train(layer.training)
