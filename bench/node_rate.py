#!/usr/bin/env python3
"""The layer-stack engine's node evaluations as a fraction of the machine's GEMM rate.

    python3 bench/node_rate.py RUN BENCH.json [--cores N]

RUN is a trained layer-stack run (its manifest.json gives the layers), BENCH.json one line of
`pathkernel bench --run RUN --contraction LAYOUT --steps A:B` (the same run). The useful work of
one gradient evaluation is counted from the layer shapes, the way a model-flops count is: the
forward pass (2 flops per multiply-add of each convolution and dense layer at one set of
weights), and the backward pass with K cotangents (each parameter layer's input gradient but the
first's, and the weight gradients the engine forms: the convolutions'; a dense layer's gradient
stays in its factors and its contraction is the bench's own `contraction_flops`). Activations,
pools, layer norms and the combine by t are not counted. A first convolution with a max-pool
after it (a nondecreasing activation between them runs after the pool) takes its weight
gradient from the pool's winners only: `fraction_of_gemm_rate` counts that gradient as performed
(a pooled output's share of the positions), `fraction_dense_count` as the dense backward's. The evaluations are the test side's
(`evaluations_per_point_step · points · steps`) and the training side's (`train · steps`, at
t = 0); their seconds are the bench's `gradient_seconds`, summed over the threads. The rate per
core is set against faer's GEMM rate of the same run divided by the cores it ran on (--cores,
default this machine's). Prints one JSON line.
"""
import argparse
import json
import os
import sys


def conv_out(n, kernel, stride, padding):
    return (n + 2 * padding - kernel) // stride + 1


def macs_per_layer(arch):
    """(name, kind, multiply-adds of one forward row) for each parameter layer of a stack."""
    body = arch["body"]
    if body.get("kind") != "layers":
        raise SystemExit("node_rate: the run is not a layer stack ([model] kind = \"layers\")")
    inp = body["input"]
    if "map" in inp:
        shape = list(inp["map"])
    elif "flat" in inp:
        shape = [inp["flat"]]
    else:
        raise SystemExit(f"node_rate: input {inp} is not an image or a vector")
    out = []
    pooled_after_first = None
    seen_since_first = set()
    for i, layer in enumerate(body["layers"]):
        name, spec = (layer, None) if isinstance(layer, str) else next(iter(layer.items()))
        if out and name not in ("conv2d", "dense", "max_pool2d"):
            seen_since_first.add(name if name != "leaky_relu" or (spec or 0) >= 0 else "leaky_relu<0")
        if name == "conv2d":
            c, h, w = shape
            k, s, p = spec["kernel"], spec["stride"], spec["padding"]
            oh, ow = conv_out(h, k, s, p), conv_out(w, k, s, p)
            out.append((f"{i}:conv2d", "conv", spec["channels"] * oh * ow * c * k * k))
            shape = [spec["channels"], oh, ow]
        elif name == "dense":
            n_in = 1
            for v in shape:
                n_in *= v
            out.append((f"{i}:dense", "dense", n_in * spec["features"]))
            shape = [spec["features"]]
        elif name in ("max_pool2d", "avg_pool2d"):
            k = spec if isinstance(spec, int) else spec["kernel"]
            s = spec if isinstance(spec, int) else spec.get("stride", k)
            c, h, w = shape
            shape = [c, (h - k) // s + 1, (w - k) // s + 1]
            if name == "max_pool2d" and len(out) == 1 and out[0][1] == "conv" and pooled_after_first is None and seen_since_first <= {"relu", "tanh", "sigmoid", "softplus", "leaky_relu"}:
                pooled_after_first = (shape[1] * shape[2]) / (h * w)
        elif name == "flatten":
            n = 1
            for v in shape:
                n *= v
            shape = [n]
        elif name in ("relu", "tanh", "sigmoid", "softplus", "gelu", "silu", "leaky_relu"):
            pass
        else:
            raise SystemExit(f"node_rate: layer kind {name} is not counted here (convolutions, dense layers, pools and activations are)")
    return out, pooled_after_first


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("bench")
    ap.add_argument("--cores", type=int, default=os.cpu_count())
    a = ap.parse_args()
    arch = json.load(open(os.path.join(a.run, "manifest.json")))["architecture"]
    bench = json.loads(open(a.bench).readline())
    k = bench["outputs"]
    layers, pooled = macs_per_layer(arch)
    forward = sum(2 * m for _, _, m in layers)
    backward = sum(2 * k * m for i, (_, kind, m) in enumerate(layers) if i > 0)
    backward += sum(2 * k * m for _, kind, m in layers if kind == "conv")
    dense_count = forward + backward
    if pooled is not None:
        backward -= 2 * k * layers[0][2] * (1 - pooled)
    per_eval = forward + backward
    test_evals = bench["evaluations_per_point_step"] * bench["points"] * bench["steps"]
    train_evals = bench["train"] * bench["steps"]
    flops = per_eval * (test_evals + train_evals)
    secs = bench["gradient_seconds"]
    per_core = flops / secs / 1e9
    peak_per_core = bench["gemm_gflops"] / a.cores
    dense_per_core = dense_count * (test_evals + train_evals) / secs / 1e9
    print(json.dumps({
        "name": "node_rate",
        "mflop_per_evaluation": per_eval / 1e6,
        "forward_mflop": forward / 1e6,
        "backward_mflop": backward / 1e6,
        "evaluations": test_evals + train_evals,
        "gradient_thread_seconds": secs,
        "gflops_per_core": per_core,
        "gemm_gflops": bench["gemm_gflops"],
        "cores": a.cores,
        "fraction_of_gemm_rate": per_core / peak_per_core,
        "mflop_per_evaluation_dense_count": dense_count / 1e6,
        "fraction_dense_count": dense_per_core / peak_per_core,
    }))


if __name__ == "__main__":
    sys.exit(main())
