"""Each recipe recorded, imported and turned into its EPK through the CLI: imported exactly, or
refused in one line naming why. Skipped without torch or the pathkernel binary."""

import json
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from pathkernel_recorder import TrajectoryRecorder, recipes  # noqa: E402

# Recipes the import refuses, with what the line must say.
REFUSED = {
    "AdamW, clip_grad_value_(0.05)": "gradient clipping by value (clip_grad_value_, clip_value 0.05) is not supported",
    "RMSprop momentum=0.9": "RMSprop with momentum = 0.9 is not supported",
    "SGD Nesterov, OneCycleLR (momentum cycled)": "Nesterov momentum that changes from step to step",
    "Adam amsgrad": "amsgrad = true is not supported",
}
TOLERANCE_ULPS = 4.0


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", list(recipes.RECIPES))
def test_recipe_round_trips_through_the_cli(name, dtype, pathkernel, tmp_path):
    r = recipes.round_trip(name, dtype, pathkernel, str(tmp_path))
    if name in REFUSED:
        assert not r["imported"] and r["rc"] == 2, r
        assert REFUSED[name] in r["line"], r["line"]
        return
    assert r["imported"], r["line"]
    assert r["ulps"] <= TOLERANCE_ULPS, r["line"]
    if dtype == "float64":
        # f64 rounding only: a few ulps, and the EPK machine equals the network.
        assert r["epk"] <= 1e-12, (r["line"], r["kernel"])
    else:
        # float32: the replay differs by float32 rounding, carried as the residual term; the
        # machine (with it) equals the network to f64 rounding.
        assert r["abs"] > 0 and r["epk"] <= 1e-12, (r["line"], r["kernel"])


def _edit(path, name, index, delta):
    with safetensors_torch.safe_open(path, "pt") as f:
        meta = f.metadata()
        t = {k: f.get_tensor(k) for k in f.keys()}
    flat = t[name].reshape(-1)
    flat[index] += delta
    safetensors_torch.save_file(t, path, metadata=meta)


def test_a_float32_adamw_run_is_accepted_and_one_weight_edited_by_5e_5_is_refused(pathkernel, tmp_path):
    rec = str(tmp_path / "rec")
    recipes.record("AdamW, constant lr", rec, "float32")
    ok = subprocess.run([pathkernel, "import", "--from", "torch", rec, "--out", str(tmp_path / "ok")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    _edit(os.path.join(rec, "step_00012.safetensors"), "0.weight", 37, 5e-5)
    bad = subprocess.run([pathkernel, "import", "--from", "torch", rec, "--out", str(tmp_path / "bad")], capture_output=True, text=True)
    assert bad.returncode == 2, bad.stdout
    line = bad.stderr.strip().splitlines()[-1]
    assert "the update of step 11 (w_12 - w_11)" in line and "at 0.weight[37]" in line, line
    assert "absolute" in line and "relative" in line and "ulps" in line, line
    assert not (tmp_path / "bad").exists()


def test_adagrad_fresh_state_is_not_taken_for_a_stepped_optimizer(tmp_path):
    net = recipes.model(torch.float64)
    xtr, ytr, xte, yte = recipes.data()
    opt = torch.optim.Adagrad(net.parameters(), lr=0.1, initial_accumulator_value=0.2)
    assert any(len(s) for s in opt.state.values()), "Adagrad creates its state in __init__"
    TrajectoryRecorder(str(tmp_path / "a"), net, xtr, ytr, xte, yte, optimizer=opt)
    # One step taken: refused.
    torch.nn.functional.cross_entropy(net(xtr), ytr).backward()
    opt.step()
    with pytest.raises(ValueError, match="already taken steps"):
        TrajectoryRecorder(str(tmp_path / "b"), net, xtr, ytr, xte, yte, optimizer=opt)


def test_momenta_and_clip_factors_are_recorded_per_step(tmp_path):
    recipes.record("AdamW, OneCycleLR (beta1 cycled)", str(tmp_path / "a"))
    j = json.load(open(tmp_path / "a" / "trajectory.json"))
    assert len(j["momenta"]) == len(j["learning_rates"]) == recipes.STEPS and len(set(j["momenta"])) > 2
    recipes.record("AdamW, clip_grad_norm_(0.5)", str(tmp_path / "b"))
    j = json.load(open(tmp_path / "b" / "trajectory.json"))
    assert j["clip"]["kind"] == "norm" and j["clip"]["max_norm"] == 0.5
    assert len(j["clip"]["factors"]) == recipes.STEPS and min(j["clip"]["factors"]) < 1.0
    # Constant momentum is not written per step.
    recipes.record("AdamW, StepLR", str(tmp_path / "c"))
    assert "momenta" not in json.load(open(tmp_path / "c" / "trajectory.json"))


def test_a_scheduler_changing_another_hyper_parameter_is_refused(tmp_path):
    net = recipes.model(torch.float64)
    xtr, ytr, xte, yte = recipes.data()
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    rec = TrajectoryRecorder(str(tmp_path / "a"), net, xtr, ytr, xte, yte, optimizer=opt)
    rec.start()
    opt.param_groups[0]["eps"] = 1e-6
    torch.nn.functional.cross_entropy(net(xtr), ytr).backward()
    with pytest.raises(ValueError, match="eps changed from 1e-08 to 1e-06"):
        opt.step()


class _Named(torch.nn.Module):
    """Not an nn.Sequential: two linear maps under their own names, which compute the stack
    [dense 6, tanh, dense 3] (`pathkernel_stack()`)."""

    def __init__(self):
        super().__init__()
        self.encoder = torch.nn.Linear(2, 6)
        self.readout = torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.readout(torch.tanh(self.encoder(x)))

    def pathkernel_stack(self):
        return {"layers": [{"dense": 6}, "tanh", {"dense": 3}],
                "names": {"0.weight": "encoder.weight", "0.bias": "encoder.bias", "2.weight": "readout.weight", "2.bias": "readout.bias"}}


def test_a_module_with_its_own_names_is_recorded_as_a_stack_and_imports(pathkernel, tmp_path):
    torch.manual_seed(0)
    net = _Named().double()
    xtr, ytr, xte, yte = recipes.data(dim=2, classes=3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01, weight_decay=0.1)
    rec = TrajectoryRecorder(str(tmp_path / "rec"), net, xtr, ytr, xte, yte, optimizer=opt)
    rec.start()
    for _ in range(6):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(xtr), ytr).backward()
        opt.step()
        rec.step(batch=None)
    rec.finish()
    with open(tmp_path / "rec" / "trajectory.json") as f:
        model = json.load(f)["model"]
    assert model["kind"] == "stack" and model["names"]["2.bias"] == "readout.bias", model
    ok = subprocess.run([pathkernel, "import", "--from", "torch", str(tmp_path / "rec"), "--out", str(tmp_path / "run")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "Sequential(Linear(2, 6), Tanh(), Linear(6, 3))" in ok.stdout, ok.stdout
    k = subprocess.run([pathkernel, "kernel", "-q", "--run", str(tmp_path / "run"), "--kind", "epk", "--strict", "--out", str(tmp_path / "k")],
                       capture_output=True, text=True)
    assert k.returncode == 0, k.stderr
    with open(tmp_path / "k" / "exactness.json") as f:
        assert json.load(f)["max_abs_error"] <= 1e-12


def test_a_stack_mapping_that_misses_a_tensor_is_refused_by_the_recorder(tmp_path):
    net = _Named().double()
    net.pathkernel_stack = lambda: {"layers": [{"dense": 6}, "tanh", {"dense": 3}], "names": {"0.weight": "encoder.weight"}}
    xtr, ytr, xte, yte = recipes.data(dim=2, classes=3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    with pytest.raises(ValueError, match="must name every state_dict tensor once"):
        TrajectoryRecorder(str(tmp_path / "a"), net, xtr, ytr, xte, yte, optimizer=opt)


class MHSelfAttention(torch.nn.Module):
    """scripts/torch_model.py's convention: an nn.MultiheadAttention as `attn`, used as
    self-attention on [n, T, d]."""

    def __init__(self, d, heads, **kw):
        super().__init__()
        self.causal = False
        self.attn = torch.nn.MultiheadAttention(d, heads, batch_first=True, dtype=torch.float64, **kw)

    def forward(self, x):
        return self.attn(x, x, x, need_weights=False)[0]


class ScaledEmbedding(torch.nn.Module):
    """torch_model.ScaledEmbedding without scale or positions: token ids [n, T] (floats) -> a
    learned embedding [n, T, d]."""

    def __init__(self, vocab, d):
        super().__init__()
        self.vocab, self.dim, self.scale, self.positions = vocab, d, 1.0, None
        self.weight = torch.nn.Parameter(torch.randn(vocab, d, dtype=torch.float64))

    def forward(self, x):
        return torch.nn.functional.embedding(x.long(), self.weight)


class LastToken(torch.nn.Module):
    """torch_model.LastToken: [n, T, d] -> [n, d]."""

    def forward(self, x):
        return x[:, -1]


def _mha_net(**kw):
    return torch.nn.Sequential(ScaledEmbedding(5, 4), MHSelfAttention(4, 2, **kw), LastToken(), torch.nn.Linear(4, 3, dtype=torch.float64))


def _record_mha(path, net, steps=8):
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 5, (12, 3), generator=g).double()
    y = torch.randint(0, 3, (12,), generator=g)
    opt = torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.05)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.02, total_steps=steps)
    rec = TrajectoryRecorder(str(path), net, x[:8], y[:8], x[8:], y[8:], optimizer=opt)
    rec.start()
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[:8]), y[:8]).backward()
        opt.step()
        rec.step(batch=None)
        sched.step()
    rec.finish()


def test_an_nn_multiheadattention_block_under_adamw_imports_as_packed_attention(pathkernel, tmp_path):
    torch.manual_seed(2)
    _record_mha(tmp_path / "rec", _mha_net())
    ok = subprocess.run([pathkernel, "import", "--from", "torch", str(tmp_path / "rec"), "--out", str(tmp_path / "run")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "MHSelfAttention(4, num_heads=2, bias=True, causal=False)" in ok.stdout, ok.stdout
    with open(tmp_path / "run" / "manifest.json") as f:
        layers = json.load(f)["architecture"]["body"]["layers"]
    assert layers[1] == {"self_attention": {"heads": 2, "shared_qkv": False, "bias": True, "causal": False, "layout": "packed"}}, layers


def test_an_nn_multiheadattention_with_a_zero_attention_position_is_refused_naming_the_attribute(pathkernel, tmp_path):
    torch.manual_seed(2)
    net = _mha_net(add_zero_attn=True)
    _record_mha(tmp_path / "rec", net, steps=2)
    bad = subprocess.run([pathkernel, "import", "--from", "torch", str(tmp_path / "rec"), "--out", str(tmp_path / "run")], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "model.modules[1] MHSelfAttention(4, num_heads=2, bias=True, causal=False): add_zero_attn = true" in bad.stderr, bad.stderr
