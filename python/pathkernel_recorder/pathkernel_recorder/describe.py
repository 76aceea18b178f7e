"""What `pathkernel import` reads of a module: `describe_module` writes one child of an
`nn.Sequential` (class, repr, the attributes its maths depends on); the import builds the layer
stack from it or refuses the module, naming it. The layer convention is `scripts/torch_model.py`'s."""

from torch import nn


def _pair(v):
    return [int(v), int(v)] if isinstance(v, int) else [int(a) for a in v]


def describe_module(m):
    """One child of an `nn.Sequential` as `pathkernel import` reads it (`model.modules[i]`): its
    class, its one-line repr and the attributes the layer's maths depends on. Modules pathkernel
    cannot express are described too (class and repr): the import refuses them, naming them."""
    kind = type(m).__name__
    d = {"type": kind, "repr": f"{kind}({m.extra_repr()})"}
    if isinstance(m, nn.Linear):
        d.update(in_features=m.in_features, out_features=m.out_features, bias=m.bias is not None)
    elif isinstance(m, nn.Conv2d):
        d.update(in_channels=m.in_channels, out_channels=m.out_channels, kernel_size=_pair(m.kernel_size), stride=_pair(m.stride),
                 padding=m.padding if isinstance(m.padding, str) else _pair(m.padding), dilation=_pair(m.dilation), groups=m.groups,
                 bias=m.bias is not None, padding_mode=m.padding_mode)
    elif isinstance(m, (nn.MaxPool2d, nn.AvgPool2d)):
        d.update(kernel_size=_pair(m.kernel_size), stride=_pair(m.stride if m.stride is not None else m.kernel_size), padding=_pair(m.padding),
                 ceil_mode=bool(m.ceil_mode))
        if isinstance(m, nn.MaxPool2d):
            d.update(dilation=_pair(m.dilation))
        else:
            d.update(divisor_override=m.divisor_override)
    elif isinstance(m, nn.Flatten):
        d.update(start_dim=m.start_dim, end_dim=m.end_dim)
    elif isinstance(m, nn.LeakyReLU):
        d.update(negative_slope=float(m.negative_slope))
    elif isinstance(m, nn.Softplus):
        d.update(beta=float(m.beta), threshold=float(m.threshold))
    elif isinstance(m, nn.GELU):
        d.update(approximate=m.approximate)
    elif isinstance(m, nn.LayerNorm):
        d.update(normalized_shape=list(m.normalized_shape), eps=float(m.eps), elementwise_affine=bool(m.elementwise_affine),
                 bias=getattr(m, "bias", None) is not None)
    elif kind == "ChannelLayerNorm":
        d.update(channels=int(m.weight.shape[0]), eps=float(m.eps))
    elif kind == "Residual" and isinstance(getattr(m, "body", None), nn.Sequential):
        d["repr"] = "Residual"
        d.update(body=[describe_module(c) for c in m.body], shortcut=None if m.shortcut is None else describe_module(m.shortcut))
    elif isinstance(m, nn.Embedding):
        d.update(num_embeddings=m.num_embeddings, embedding_dim=m.embedding_dim, padding_idx=m.padding_idx, max_norm=m.max_norm, scale=1.0)
    elif kind == "ScaledEmbedding":
        d.update(num_embeddings=int(m.vocab), embedding_dim=int(m.dim), padding_idx=None, max_norm=None, scale=float(m.scale),
                 positions=int(m.positions) if m.positions else None)
    elif kind == "SelfAttention":
        enc = m.head1_encoder if m.shared else m.head1_query
        d.update(d=enc.in_features, heads=int(m.heads), head_dim=enc.out_features, shared_qkv=bool(m.shared), bias=enc.bias is not None,
                 causal=bool(m.causal))
    elif kind == "MHSelfAttention" and isinstance(getattr(m, "attn", None), nn.MultiheadAttention):
        a = m.attn
        if not isinstance(getattr(m, "causal", None), bool):
            raise ValueError(f"{kind}: the attribute `causal` (True/False) says whether its forward masks j > i (scripts/torch_model.py's MHSelfAttention)")
        d["repr"] = f"MHSelfAttention({a.embed_dim}, num_heads={a.num_heads}, bias={a.in_proj_bias is not None}, causal={bool(m.causal)})" + (
            "" if a.batch_first else ", batch_first=False")
        d.update(embed_dim=int(a.embed_dim), num_heads=int(a.num_heads), bias=a.in_proj_bias is not None, causal=bool(m.causal),
                 batch_first=bool(a.batch_first), kdim=int(a.kdim), vdim=int(a.vdim), add_bias_kv=a.bias_k is not None,
                 add_zero_attn=bool(a.add_zero_attn), dropout=float(a.dropout), training=bool(m.training))
    elif isinstance(m, nn.MultiheadAttention):
        d.update(repr=f"MultiheadAttention({m.embed_dim}, num_heads={m.num_heads})", embed_dim=int(m.embed_dim), num_heads=int(m.num_heads))
    elif kind in ("LastToken", "MeanTokens"):
        pass
    elif isinstance(m, nn.modules.dropout._DropoutNd):
        d.update(p=float(m.p), training=bool(m.training))
    elif isinstance(m, nn.Sequential):
        d["repr"] = "Sequential(" + ", ".join(describe_module(c)["repr"] for c in m) + ")"
    return d
