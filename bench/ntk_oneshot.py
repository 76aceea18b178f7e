"""The one-step NTK as a new user would compute it in numpy: load the step file and the dataset,
compute the closed form (bench/compare.py's ntk_numpy), save the array. The peer of
`pathkernel kernel --run R --kind ntk --step S --points test --out O` timed by
bench/ntk_oneshot.sh as whole processes.

    python bench/ntk_oneshot.py RUN STEP OUT.npy
"""
import json
import sys

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from compare import ntk_numpy  # noqa: E402


def main():
    run, step, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    arch = json.load(open(f"{run}/manifest.json"))["architecture"]
    ds = load_file(f"{run}/dataset.safetensors")
    w = load_file(f"{run}/trajectory/step-{step:06d}.safetensors")
    nl = len(arch["body"]["widths"]) - 1
    params = [(w[f"layers.{l}.weight"], w[f"layers.{l}.bias"]) for l in range(nl)]
    g = np.ascontiguousarray(ntk_numpy(params, ds["x_test"], ds["x_train"]))
    np.save(out, g)


if __name__ == "__main__":
    main()
