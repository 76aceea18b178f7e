"""PyTorch modules for pathkernel's layer stacks (`[model] kind = "layers"`), float64.

    import torch_stack
    net = torch_stack.build(manifest["architecture"])   # nn.Sequential, parameters named as ours
    net.load_state_dict(states)                          # a trajectory step's tensors, as torch

The layer list in a run's manifest (`architecture.body.layers`) maps one to one onto an
`nn.Sequential`: `dense` -> `Linear`, `conv2d` -> `Conv2d`, `max_pool2d` / `avg_pool2d` ->
`MaxPool2d` / `AvgPool2d` (no padding, floor mode), `flatten` -> `Flatten`, the activations ->
`ReLU`, `LeakyReLU(slope)`, `Tanh`, `Sigmoid`, `Softplus`, `GELU()` (exact erf form), `SiLU`,
`layer_norm` -> `LayerNorm(F)` on flat features or `ChannelLayerNorm(C)` (over the channels at
each position of a [C, H, W] map), and `residual` -> `Residual(body, shortcut)` below. Parameter
names are then pathkernel's (`3.weight`, `2.body.0.weight`, `2.shortcut.weight`).

`Residual` is the one convention a user copies: `y = body(x) + shortcut(x)`, the shortcut the
identity when the body keeps the shape, else `Linear` (flat) or a 1x1 `Conv2d` with the stride
that gives the body's output size (maps), both with a bias.
"""

import torch
from torch import nn


class ChannelLayerNorm(nn.Module):
    """Layer norm over the channels at each position of [n, C, H, W] maps (ConvNeXt's)."""

    def __init__(self, channels, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels, dtype=torch.float64))
        self.bias = nn.Parameter(torch.zeros(channels, dtype=torch.float64))

    def forward(self, x):
        mean = x.mean(dim=1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=1, keepdim=True)
        y = (x - mean) / torch.sqrt(var + self.eps)
        return y * self.weight[None, :, None, None] + self.bias[None, :, None, None]


class Residual(nn.Module):
    """`y = body(x) + shortcut(x)` (identity shortcut when `shortcut` is None)."""

    def __init__(self, body, shortcut=None):
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x):
        return self.body(x) + (x if self.shortcut is None else self.shortcut(x))


def _size(shape):
    if "flat" in shape:
        return ("flat", shape["flat"])
    c, h, w = shape["map"]
    return ("map", c, h, w)


def _layer(spec, shape):
    """(module, output shape) of one layer spec on an input of `shape`."""
    if isinstance(spec, str):
        kind, arg = spec, None
    else:
        ((kind, arg),) = spec.items()
    f64 = dict(dtype=torch.float64)
    if kind == "dense":
        m = nn.Linear(shape[1], arg["features"], bias=arg["bias"], **f64)
        return m, ("flat", arg["features"])
    if kind == "conv2d":
        _, c, h, w = shape
        k, s, p = arg["kernel"], arg["stride"], arg["padding"]
        m = nn.Conv2d(c, arg["channels"], k, stride=s, padding=p, bias=arg["bias"], **f64)
        return m, ("map", arg["channels"], (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1)
    if kind in ("max_pool2d", "avg_pool2d"):
        _, c, h, w = shape
        k, s = arg["kernel"], arg["stride"]
        m = nn.MaxPool2d(k, stride=s) if kind == "max_pool2d" else nn.AvgPool2d(k, stride=s)
        return m, ("map", c, (h - k) // s + 1, (w - k) // s + 1)
    if kind == "flatten":
        n = shape[1] if shape[0] == "flat" else shape[1] * shape[2] * shape[3]
        return nn.Flatten(), ("flat", n)
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "softplus": nn.Softplus, "gelu": nn.GELU, "silu": nn.SiLU}
    if kind in acts:
        return acts[kind](), shape
    if kind == "leaky_relu":
        return nn.LeakyReLU(arg), shape
    if kind == "layer_norm":
        if shape[0] == "flat":
            return nn.LayerNorm(shape[1], eps=arg["eps"], **f64), shape
        return ChannelLayerNorm(shape[1], eps=arg["eps"]), shape
    if kind == "residual":
        body, out = build_list(arg, shape)
        shortcut = None
        if out != shape:
            if shape[0] == "flat":
                shortcut = nn.Linear(shape[1], out[1], **f64)
            else:
                _, c, h, w = shape
                s = next(s for s in range(1, max(h, w) + 1) if (h - 1) // s + 1 == out[2] and (w - 1) // s + 1 == out[3])
                shortcut = nn.Conv2d(c, out[1], 1, stride=s, **f64)
        return Residual(body, shortcut), out
    raise ValueError(f"unknown layer {spec!r}")


def build_list(specs, shape):
    mods = []
    for spec in specs:
        m, shape = _layer(spec, shape)
        mods.append(m)
    return nn.Sequential(*mods), shape


def build(architecture):
    """The raw network g_w (no alpha, zero_output or output map) of a run's architecture."""
    body = architecture["body"]
    if body["kind"] != "layers":
        raise ValueError("not a layer stack (model.kind = \"layers\")")
    shape = _size(body["input"])
    net, out = build_list(body["layers"], shape)
    if out != ("flat", body["outputs"]):
        raise ValueError(f"the stack gives {out}, the run has {body['outputs']} outputs")
    return net, shape
