"""Rebuild a network exported by `pathkernel export --format torch` (a PyTorch state_dict in
safetensors, f64).

    import torch_model
    net = torch_model.load("model.safetensors")          # torch.nn.Module, float64
    logits = net(x)                                       # x: [n, d] rows (CNN: [n, C, H, W] too)
    logits = torch_model.forward_numpy("model.safetensors", x)   # numpy only, no torch

The module's output is the network's logits `alpha * (g_w(x) - [zero_output] g_{w_0}(x))`;
`log_softmax(logits)` is pathkernel's f for a classification run (metadata `output`).

- MLP: `nn.Sequential(Linear, ReLU|Tanh, ..., Linear)`, names `0.weight` [out, in], `0.bias`,
  `2.weight`, ...
- CNN: `nn.Sequential(Conv2d, ReLU|Tanh, MaxPool2d, Flatten, Linear)`, names `0.*` and `4.*`;
  `load` wraps it so that flat rows [n, C*H*W] are accepted as well as images.
- Layer stack (`[model] kind = "layers"`): `build_stack` makes the `nn.Sequential` below, one
  child per layer, parameter names equal to ours (`3.weight`, `2.body.0.weight`,
  `2.shortcut.weight`). `forward_numpy` covers the MLP and the CNN only; a stack runs in torch.

The layer stack convention (the one a user copies to train a network pathkernel can import):
`dense` -> `Linear`, `conv2d` -> `Conv2d` (square kernel, zero padding), `max_pool2d` /
`avg_pool2d` -> `MaxPool2d` / `AvgPool2d` (no padding, floor mode), `flatten` -> `Flatten()`,
the activations -> `ReLU()`, `LeakyReLU(slope)`, `Tanh()`, `Sigmoid()`, `Softplus()` (beta 1),
`GELU()` (the exact erf form), `SiLU()`; `layer_norm` -> `LayerNorm(F)` on flat features or
`ChannelLayerNorm(C)` below (over the channels at each position of a [C, H, W] map); `residual`
-> `Residual(body, shortcut)` below: `y = body(x) + shortcut(x)`, the shortcut `None` (the
identity) when the body keeps the shape, else `Linear(F, F')` (flat) or a 1x1
`Conv2d(C, C', 1, stride=s)` whose stride s gives the body's output size (maps), both with a
bias. On token ids [n, T] (`data.kind = "modular"`): `embedding` -> `ScaledEmbedding(vocab, dim,
scale)`, `self_attention` -> `SelfAttention` (ExPLAIND's heads: `head{h}_encoder` shared by
query, key and value, or `head{h}_query/key/value`, and `head{h}_decoder`, the heads summed;
`scaled_dot_product_attention`; with `layout = "packed"` -> `MHSelfAttention(d, heads, bias,
causal)`, PyTorch's `nn.MultiheadAttention` as its attribute `attn`, names `attn.in_proj_weight`,
`attn.in_proj_bias`, `attn.out_proj.weight`, `attn.out_proj.bias`), `last_token` -> `LastToken()` (`x[:, -1]`), `mean_tokens` ->
`MeanTokens()` (`x.mean(dim=1)`), all below. Batch
norm (a point's output depends on its batch) and dropout in training mode are not
layers pathkernel can express; `describe_module` writes what `pathkernel import` reads (and
refuses, naming the module).
- alpha is already folded into the last layer by the exporter.
- zero_output: the frozen initial network is stored as `init.*`; the module is
  `net(x) - init(x)` (a plain `Sequential.load_state_dict(..., strict=False)` would give `net`
  alone).

Usage as a check (prints the max |difference| between the numpy and the torch forward, and with
the output of `pathkernel kernel --run RUN --kind ntk --out K` against pathkernel's own f):

    python scripts/torch_model.py model.safetensors [x.npy | K]
"""

import json
import os
import struct
import sys

import numpy as np

try:
    import torch
    from torch import nn
except ImportError:  # the numpy forward works without torch
    torch = nn = None

# `describe_module` (what `pathkernel import` reads of a module) lives in the recorder package
# (python/pathkernel_recorder); found there from a checkout, or installed.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python", "pathkernel_recorder"))
try:
    from pathkernel_recorder.describe import describe_module  # noqa: E402,F401
except ImportError:  # torch absent: the numpy forward still works
    describe_module = None

_DTYPES = {"F64": np.float64, "F32": np.float32, "I64": np.int64}


def read_safetensors(path):
    """(tensors, metadata) of a safetensors file, with numpy alone."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        arr = np.frombuffer(raw[base + a : base + b], dtype=_DTYPES[info["dtype"]])
        tensors[name] = arr.reshape(info["shape"]).copy()
    return tensors, meta


def _spec(meta):
    if meta.get("format") != "pytorch-state-dict":
        raise ValueError("not a file written by `pathkernel export --format torch` (metadata format)")
    return json.loads(meta["architecture"])


def _act_np(kind, z):
    return np.maximum(z, 0.0) if kind == "relu" else np.tanh(z)


def _raw_numpy(arch, t, prefix, x):
    body = arch["body"]
    bias = arch["bias"]
    act = arch["activation"]
    if body["kind"] == "mlp":
        a = x.reshape(x.shape[0], -1)
        layers = len(body["widths"]) - 1
        for l in range(layers):
            z = a @ t[f"{prefix}{2 * l}.weight"].T
            if bias:
                z = z + t[f"{prefix}{2 * l}.bias"]
            a = _act_np(act, z) if l + 1 < layers else z
        return a
    c, h, w = body["image"]
    k, s, p, pool = body["kernel"], body["stride"], body["padding"], body["pool"]
    n = x.shape[0]
    img = x.reshape(n, c, h, w)
    img = np.pad(img, ((0, 0), (0, 0), (p, p), (p, p)))
    cw = t[prefix + "0.weight"]
    co = cw.shape[0]
    ho = (h + 2 * p - k) // s + 1
    wo = (w + 2 * p - k) // s + 1
    out = np.zeros((n, co, ho, wo))
    for i in range(k):
        for j in range(k):
            patch = img[:, :, i : i + s * (ho - 1) + 1 : s, j : j + s * (wo - 1) + 1 : s]  # [n, c, ho, wo]
            out += np.einsum("nchw,oc->nohw", patch, cw[:, :, i, j])
    if bias:
        out += t[prefix + "0.bias"][None, :, None, None]
    out = _act_np(act, out)
    hp, wp = ho // pool, wo // pool
    out = out[:, :, : hp * pool, : wp * pool].reshape(n, co, hp, pool, wp, pool).max(axis=(3, 5))
    z = out.reshape(n, -1) @ t[prefix + "4.weight"].T
    if bias:
        z = z + t[prefix + "4.bias"]
    return z


def forward_numpy(path, x):
    """The logits of the exported network on rows x ([n, d] or CNN images [n, C, H, W]), numpy only."""
    t, meta = read_safetensors(path)
    arch = _spec(meta)
    if arch["body"]["kind"] == "layers":
        raise ValueError("forward_numpy covers the MLP and the CNN; run a layer stack with load(path) (torch)")
    x = np.asarray(x, dtype=np.float64)
    z = _raw_numpy(arch, t, "", x)
    if meta.get("zero_output") == "true":
        z = z - _raw_numpy(arch, t, "init.", x)
    return z


if nn is not None:

    class ChannelLayerNorm(nn.Module):
        """Layer norm over the channels at each position of [n, C, H, W] maps (ConvNeXt's);
        parameters `weight` [C] (1) and `bias` [C] (0)."""

        def __init__(self, channels, eps=1e-5, dtype=torch.float64):
            super().__init__()
            self.channels = channels
            self.eps = eps
            self.weight = nn.Parameter(torch.ones(channels, dtype=dtype))
            self.bias = nn.Parameter(torch.zeros(channels, dtype=dtype))

        def forward(self, x):
            mean = x.mean(dim=1, keepdim=True)
            var = ((x - mean) ** 2).mean(dim=1, keepdim=True)
            y = (x - mean) / torch.sqrt(var + self.eps)
            return y * self.weight[None, :, None, None] + self.bias[None, :, None, None]

        def extra_repr(self):
            return f"{self.channels}, eps={self.eps}"

    class Residual(nn.Module):
        """`y = body(x) + shortcut(x)`: `body` an `nn.Sequential`, `shortcut` None (identity),
        `Linear` or a 1x1 `Conv2d` (see the module docs). Parameters `body.j.*`, `shortcut.*`."""

        def __init__(self, body, shortcut=None):
            super().__init__()
            self.body = body
            self.shortcut = shortcut

        def forward(self, x):
            return self.body(x) + (x if self.shortcut is None else self.shortcut(x))

    class ScaledEmbedding(nn.Module):
        """`embedding`: token ids [n, T] (floats holding integers, or integers) -> `scale *
        weight[x] (+ position)` [n, T, dim]; parameters `weight` [vocab, dim] (nn.Embedding's) and,
        with `positions` = T, a learned position embedding `position` [T, dim]."""

        def __init__(self, vocab, dim, scale=1.0, positions=None, dtype=torch.float64):
            super().__init__()
            self.vocab, self.dim, self.scale, self.positions = vocab, dim, scale, positions
            self.weight = nn.Parameter(torch.randn(vocab, dim, dtype=dtype))
            if positions:
                self.position = nn.Parameter(torch.randn(positions, dim, dtype=dtype))

        def forward(self, x):
            y = torch.nn.functional.embedding(x.long(), self.weight) * self.scale
            return y + self.position if self.positions else y

        def extra_repr(self):
            return f"{self.vocab}, {self.dim}, scale={self.scale}" + (f", positions={self.positions}" if self.positions else "")

    class SelfAttention(nn.Module):
        """`self_attention` (ExPLAIND's heads): on [n, T, d], `sum_h head{h}_decoder(SDPA(q, k,
        v))` with `q = k = v = head{h}_encoder(x)` when shared, else `head{h}_query/key/value(x)`;
        scale 1/sqrt(d_h), causal mask when asked. Parameters named and ordered as pathkernel's:
        every head's encoders, then every head's decoder."""

        def __init__(self, d, heads, head_dim, shared_qkv, bias, causal, dtype=torch.float64):
            super().__init__()
            self.heads, self.shared, self.causal = heads, shared_qkv, causal
            for h in range(1, heads + 1):
                for p in (["encoder"] if shared_qkv else ["query", "key", "value"]):
                    setattr(self, f"head{h}_{p}", nn.Linear(d, head_dim, bias=bias, dtype=dtype))
            for h in range(1, heads + 1):
                setattr(self, f"head{h}_decoder", nn.Linear(head_dim, d, bias=bias, dtype=dtype))

        def forward(self, x):
            out = 0
            sdpa = torch.nn.functional.scaled_dot_product_attention
            for h in range(1, self.heads + 1):
                if self.shared:
                    q = k = v = getattr(self, f"head{h}_encoder")(x)
                else:
                    q, k, v = (getattr(self, f"head{h}_{p}")(x) for p in ("query", "key", "value"))
                out = out + getattr(self, f"head{h}_decoder")(sdpa(q, k, v, is_causal=self.causal))
            return out

    class MHSelfAttention(nn.Module):
        """`self_attention` with `layout = "packed"`: PyTorch's own `nn.MultiheadAttention` (the
        attribute `attn`) used as self-attention on [n, T, d], `attn(x, x, x)[0]`, with the causal
        mask j <= i when asked. Parameters `attn.in_proj_weight` [3d, d], `attn.in_proj_bias`
        [3d], `attn.out_proj.weight` [d, d], `attn.out_proj.bias` [d] (PyTorch's names, as
        pathkernel's). It takes [n, T, d] whatever the held module's `batch_first` (a
        `batch_first=False` one is given the sequence first and its output turned back)."""

        def __init__(self, embed_dim, num_heads, bias=True, causal=False, batch_first=True, dropout=0.0, dtype=torch.float64, **kw):
            super().__init__()
            self.causal = causal
            self.attn = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, bias=bias, batch_first=batch_first, dtype=dtype, **kw)

        def forward(self, x):
            mask = None
            if self.causal:
                t = x.shape[1]
                mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            if not self.attn.batch_first:
                x = x.transpose(0, 1)
            y = self.attn(x, x, x, need_weights=False, attn_mask=mask, is_causal=self.causal)[0]
            return y if self.attn.batch_first else y.transpose(0, 1)

        def extra_repr(self):
            a = self.attn
            return f"{a.embed_dim}, num_heads={a.num_heads}, bias={a.in_proj_bias is not None}, causal={self.causal}" + ("" if a.batch_first else ", batch_first=False")

    class LastToken(nn.Module):
        """`last_token`: [n, T, d] -> [n, d], the last position."""

        def forward(self, x):
            return x[:, -1]

    class MeanTokens(nn.Module):
        """`mean_tokens`: [n, T, d] -> [n, d], the mean over the positions."""

        def forward(self, x):
            return x.mean(dim=1)


def _shape(shape):
    if "flat" in shape:
        return ("flat", shape["flat"])
    if "tokens" in shape:
        return ("tokens", *shape["tokens"])
    if "seq" in shape:
        return ("seq", *shape["seq"])
    c, h, w = shape["map"]
    return ("map", c, h, w)


def _layer(spec, shape):
    """(module, output shape) of one layer spec of a run's manifest on an input of `shape`."""
    if isinstance(spec, str):
        kind, arg = spec, None
    else:
        ((kind, arg),) = spec.items()
    f64 = dict(dtype=torch.float64)
    if kind == "dense":
        # On a sequence `Linear` maps the last dimension: the same map at every position.
        m = nn.Linear(shape[-1], arg["features"], bias=arg["bias"], **f64)
        return m, shape[:-1] + (arg["features"],)
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
        n = int(np.prod(shape[1:])) if shape[0] != "tokens" else shape[1]
        return nn.Flatten(), ("flat", n)
    if kind == "embedding":
        _, t, _ = shape
        return ScaledEmbedding(arg["vocab"], arg["dim"], arg["scale"], t if arg.get("positions") else None), ("seq", t, arg["dim"])
    if kind == "self_attention":
        _, t, d = shape
        if arg.get("layout") == "packed":
            return MHSelfAttention(d, arg["heads"], bias=arg["bias"], causal=arg["causal"]), shape
        dh = arg.get("head_dim") or d // arg["heads"]
        return SelfAttention(d, arg["heads"], dh, arg["shared_qkv"], arg["bias"], arg["causal"]), shape
    if kind == "last_token":
        _, t, d = shape
        return LastToken(), ("flat", d)
    if kind == "mean_tokens":
        _, t, d = shape
        return MeanTokens(), ("flat", d)
    acts = {"relu": nn.ReLU, "tanh": nn.Tanh, "sigmoid": nn.Sigmoid, "softplus": nn.Softplus, "gelu": nn.GELU, "silu": nn.SiLU}
    if kind in acts:
        return acts[kind](), shape
    if kind == "leaky_relu":
        return nn.LeakyReLU(arg), shape
    if kind == "layer_norm":
        if shape[0] in ("flat", "seq"):
            return nn.LayerNorm(shape[-1], eps=arg["eps"], **f64), shape
        return ChannelLayerNorm(shape[1], eps=arg["eps"]), shape
    if kind == "residual":
        body, out = _build_list(arg, shape)
        shortcut = None
        if out != shape:
            if shape[0] in ("flat", "seq"):
                shortcut = nn.Linear(shape[-1], out[-1], **f64)
            else:
                _, c, h, w = shape
                s = next(s for s in range(1, max(h, w) + 1) if (h - 1) // s + 1 == out[2] and (w - 1) // s + 1 == out[3])
                shortcut = nn.Conv2d(c, out[1], 1, stride=s, **f64)
        return Residual(body, shortcut), out
    raise ValueError(f"unknown layer {spec!r}")


def _build_list(specs, shape):
    mods = []
    for spec in specs:
        m, shape = _layer(spec, shape)
        mods.append(m)
    return nn.Sequential(*mods), shape


def build_stack(architecture):
    """(net, input shape) of a run's `[model] kind = "layers"` architecture (the manifest's or an
    export's metadata `architecture`): the raw network g_w as a float64 `nn.Sequential` (no
    alpha, zero_output or output map), parameter names equal to pathkernel's."""
    body = architecture["body"]
    if body["kind"] != "layers":
        raise ValueError('not a layer stack (model.kind = "layers")')
    shape = _shape(body["input"])
    net, out = _build_list(body["layers"], shape)
    if out != ("flat", body["outputs"]):
        raise ValueError(f"the stack gives {out}, the run has {body['outputs']} outputs")
    return net, shape


def _sequential(arch):
    body = arch["body"]
    if body["kind"] == "layers":
        return build_stack(arch)[0]
    bias = arch["bias"]
    act = nn.ReLU if arch["activation"] == "relu" else nn.Tanh
    if body["kind"] == "mlp":
        widths = body["widths"]
        layers = []
        for l in range(len(widths) - 1):
            if l > 0:
                layers.append(act())
            layers.append(nn.Linear(widths[l], widths[l + 1], bias=bias))
        return nn.Sequential(*layers).double()
    c, h, w = body["image"]
    k, s, p, pool = body["kernel"], body["stride"], body["padding"], body["pool"]
    ho = (h + 2 * p - k) // s + 1
    wo = (w + 2 * p - k) // s + 1
    feat = body["channels"] * (ho // pool) * (wo // pool)
    return nn.Sequential(
        nn.Conv2d(c, body["channels"], k, stride=s, padding=p, bias=bias),
        act(),
        nn.MaxPool2d(pool),
        nn.Flatten(),
        nn.Linear(feat, body["outputs"], bias=bias),
    ).double()


def load(path):
    """The exported network as a float64 torch.nn.Module whose output is the logits."""
    t, meta = read_safetensors(path)
    arch = _spec(meta)
    net = _sequential(arch)
    net.load_state_dict({k: torch.from_numpy(v) for k, v in t.items() if not k.startswith("init.")})
    init = None
    if meta.get("zero_output") == "true":
        init = _sequential(arch)
        init.load_state_dict({k[len("init."):]: torch.from_numpy(v) for k, v in t.items() if k.startswith("init.")})
        for q in init.parameters():
            q.requires_grad_(False)
    body = arch["body"]
    image = body.get("image") or (body["input"]["map"] if body["kind"] == "layers" and "map" in body["input"] else None)

    class Exported(nn.Module):
        """net(x) (− init(x) for zero_output); flat rows are reshaped to images for a CNN."""

        def __init__(self):
            super().__init__()
            self.net = net
            self.init = init

        def forward(self, x):
            if image is not None and x.dim() == 2:
                x = x.reshape(x.shape[0], *image)
            z = self.net(x)
            if self.init is not None:
                z = z - self.init(x)
            return z

    return Exported() if (init is not None or image is not None) else net


def _log_softmax(z):
    m = z.max(axis=1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=1, keepdims=True))


def main(argv):
    """python torch_model.py MODEL.safetensors [x.npy | KERNEL_OUT]

    With KERNEL_OUT (the --out of `pathkernel kernel --run RUN`, RUN the exported run and the
    exported step its last state), the exported module is compared on the kernel's row points
    with pathkernel's own network values f (predictions.parquet's `network`, needs pyarrow)."""
    path = argv[1]
    t, meta = read_safetensors(path)
    arch = _spec(meta)
    ours = None
    if len(argv) > 2 and os.path.isdir(argv[2]):
        import pyarrow.parquet as pq

        x = read_safetensors(os.path.join(argv[2], "gram.safetensors"))[0]["points"]
        pred = pq.read_table(os.path.join(argv[2], "predictions.parquet")).to_pydict()
        k = int(max(pred["class"])) + 1
        ours = np.zeros((x.shape[0], k))
        ours[np.array(pred["point"]), np.array(pred["class"])] = pred["network"]
    elif len(argv) > 2:
        x = np.load(argv[2])
    else:
        rng = np.random.default_rng(0)
        body = arch["body"]
        if body["kind"] == "mlp":
            d = body["widths"][0]
        elif body["kind"] == "cnn":
            d = int(np.prod(body["image"]))
        else:
            d = body["input"]["flat"] if "flat" in body["input"] else int(np.prod(body["input"]["map"]))
        x = rng.normal(size=(16, d))
    f = (lambda z: _log_softmax(z)) if meta.get("output") == "log_softmax" else (lambda z: z)
    z_np = None
    if arch["body"]["kind"] != "layers":
        z_np = forward_numpy(path, x)
        print(f"{meta['module']}: numpy logits {z_np.shape}")
        if ours is not None:
            print(f"max |numpy f - pathkernel f| = {np.abs(f(z_np) - ours).max():.3e}")
    if torch is None:
        print("torch not installed: numpy forward only")
        return
    with torch.no_grad():
        z_t = load(path)(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()
    if z_np is not None:
        print(f"max |numpy - torch| (logits) = {np.abs(z_np - z_t).max():.3e}")
    else:
        print(f"{meta['module']}: torch logits {z_t.shape}")
    if ours is not None:
        print(f"max |torch f - pathkernel f| = {np.abs(f(z_t) - ours).max():.3e}")


if __name__ == "__main__":
    main(sys.argv)
