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
    x = np.asarray(x, dtype=np.float64)
    z = _raw_numpy(arch, t, "", x)
    if meta.get("zero_output") == "true":
        z = z - _raw_numpy(arch, t, "init.", x)
    return z


def _sequential(arch):
    import torch.nn as nn

    body = arch["body"]
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
    import torch
    import torch.nn as nn

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
    image = arch["body"].get("image")

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
        d = arch["body"]["widths"][0] if arch["body"]["kind"] == "mlp" else int(np.prod(arch["body"]["image"]))
        x = rng.normal(size=(16, d))
    z_np = forward_numpy(path, x)
    print(f"{meta['module']}: numpy logits {z_np.shape}")
    f = (lambda z: _log_softmax(z)) if meta.get("output") == "log_softmax" else (lambda z: z)
    if ours is not None:
        print(f"max |numpy f - pathkernel f| = {np.abs(f(z_np) - ours).max():.3e}")
    try:
        import torch
    except ImportError:
        print("torch not installed: numpy forward only")
        return
    with torch.no_grad():
        z_t = load(path)(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy()
    print(f"max |numpy - torch| (logits) = {np.abs(z_np - z_t).max():.3e}")
    if ours is not None:
        print(f"max |torch f - pathkernel f| = {np.abs(f(z_t) - ours).max():.3e}")


if __name__ == "__main__":
    main(sys.argv)
