"""Writes tests/data/torch/init-mlp.safetensors: the state_dict of a float64 PyTorch
`nn.Sequential(Linear(2, 6), Tanh(), Linear(6, 5), Tanh(), Linear(5, 3))` with PyTorch's default
initialisation under torch.manual_seed(20), saved by safetensors.torch.save_file. tests/torch.rs
starts a run from it (`[model] init`), trains, exports and compares the exported network with
ours. Run with a Python that has torch and safetensors:

    /work/venv/bin/python scripts/make_torch_fixture.py
"""

import os

import torch
import torch.nn as nn
from safetensors.torch import save_file

here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "..", "tests", "data", "torch", "init-mlp.safetensors")
torch.manual_seed(20)
model = nn.Sequential(nn.Linear(2, 6), nn.Tanh(), nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out)
print(f"wrote {os.path.normpath(out)}: {model}")
for k, v in model.state_dict().items():
    print(f"  {k} {list(v.shape)} sum {v.sum().item():.17g}")
