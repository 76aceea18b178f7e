"""Grokking `a + b mod p` with ExPLAIND's one-layer transformer, in PyTorch (torch
outside CI, as scripts/compare_explaind.py). Our own implementation of the model of ExPLAIND's
`explaind/modulo_model/model.py` (`SingleLayerTransformerClassifier`, explaind 0.1.0), trained
full batch by `torch.optim.AdamW` in float64 (or float32), one torch thread by default.

    OMP_NUM_THREADS=1 python scripts/grokking_torch.py [--p 31] [--d 64] [--heads 4] [--m 256]
        [--train-frac 0.5] [--seed 0] [--data-seed 0] [--epochs 5000] [--lr 1e-3] [--wd 1.0]
        [--beta2 0.98] [--init-scale 1.0] [--dtype float64|float32] [--eval-every 1]
        [--stop-when-generalised N] [--max-seconds S] [--print-every 100] [--json OUT.json] [--history-every K] [--record DIR] [--threads 1]
    python scripts/grokking_torch.py --restack REC OUT     # an older recording's model as a pathkernel stack
    python scripts/grokking_torch.py --check-explaind     # needs explaind (Python >= 3.12)

The setting that groks on one thread in about a minute (bench/grokking/sweep.md; the defaults
below are ExPLAIND's init scale 1.0, with which nothing grokked there):

    OMP_NUM_THREADS=1 python scripts/grokking_torch.py --p 31 --d 64 --heads 4 --m 256 --train-frac 0.8 \
        --lr 1e-3 --wd 2 --init-scale 0.1 --seed 0 --data-seed 0 --epochs 5840

The task (ExPLAIND's `ModulusDataGenerator`, power 1, arithmetic tokens): every unordered pair
{a, b} of residues, a sequence of four token ids `[a, p, b, p + 1]` (`p` is `+`, `p + 1` is `=`;
ExPLAIND writes the larger residue first, and so do we: a >= b), target `(a + b) mod p`; p(p+1)/2
examples. A seeded permutation (`--data-seed`) takes `round(train_frac * p(p+1)/2)` of them for
training; all the others are held out (ExPLAIND's published run draws 4 000 training and 2 000
validation pairs of the 6 441 at p = 113). The model does not see positions (below), so the order
of a and b is immaterial: `[a, +, b, =]` and `[b, +, a, =]` give the same output.

The model, `GrokkingTransformer(p, d, heads, m)`, n_token = p + 2, d_h = d / heads; for a batch of
token ids x [n, 4]:

    e   = input_emb(x) * sqrt(d)                                   [n, 4, d]
    att = sum_h head{h}_decoder( SDPA(q, k, v) ),  q = k = v = head{h}_encoder(e)   [n, 4, d]
          SDPA = softmax(q k^T / sqrt(d_h)) v, over all 4 positions (no mask)
    z   = att[:, -1]                                               [n, d]  (the `=` position)
    r   = z + relu(linear2(relu(linear1(z))))                      [n, d]
    logits = decoder(r)                                            [n, p + 2]

and the network's output f is `log_softmax(logits)`, the loss the mean cross-entropy (ExPLAIND's
NLLLoss of its log-softmax output: the same function). `forward` returns the logits (the
recorder's convention: `F.cross_entropy` on logits). Parameters, PyTorch's names and shapes (every
one trained; these are the state_dict keys the recording holds):

    input_emb.weight          [p + 2, d]     nn.Embedding, init N(0, 1)
    head{h}_encoder.weight    [d / H, d]     h = 1..H, nn.Linear(d, d/H, bias=False): q = k = v
    head{h}_decoder.weight    [d, d / H]     h = 1..H, nn.Linear(d/H, d, bias=False)
    linear1.weight            [m, d]         nn.Linear(d, m) (with bias)
    linear1.bias              [m]
    linear2.weight            [d, m]         nn.Linear(m, d) (with bias)
    linear2.bias              [d]
    decoder.weight            [p + 2, d]     nn.Linear(d, p + 2, bias=False), the unembedding

(the encoders are all created before the decoders, as ExPLAIND creates them, so that the state
dict's order and the initialisation's draws are the same as theirs). What ExPLAIND's source says,
checked line by line (`--check-explaind` runs both on the same weights):
- no residual around attention: `output = apply_attn(src)` (their residual
  `src + self.attention(...)` is commented out); the MLP's residual adds a ReLU'd output:
  `output = output + relu(linear2(relu(linear1(output))))` (a ReLU after linear2 too);
- no positional embedding in the forward: the module registers `positional_encoding.pe`, an
  `nn.Parameter(torch.randn(1, 10, d))`, but its call is commented out (the README of
  modulo_model says the opposite). It never gets a gradient, so AdamW never moves it (torch skips
  parameters whose grad is None, weight decay included). We do not register it, but draw the same
  randn(1, 10, d) at the same point of the constructor (discarded) so that a seed gives ExPLAIND's
  initial weights exactly (`--check-explaind` compares them);
- no mask: `scaled_dot_product_attention(head, head, head)` with the defaults (no attn_mask, not
  causal, dropout 0, scale 1/sqrt(d_h));
- no layer norm (commented out); dropout layers only (p = 0 in the published run: identity);
- MLP biases: linear1 and linear2 have biases (PyTorch's default); the heads and the unembedding
  do not;
- ExPLAIND hard-codes four heads (head1..head4) whatever `nhead` is; nhead only sets d_h = d/nhead.
  `--heads H` builds H heads here (the same as theirs for H = 4);
- the MLP and the unembedding act on each position alone and only the last position is read, so
  we apply them to the last position only; ExPLAIND applies them to all four and slices the
  logits: the same function (`--check-explaind`: their log-softmax and ours differ by at most
  1.4e-14 on outputs up to 114 in magnitude, float64, randomly perturbed weights).

Their published run (experiments/train_models/modulo_model.py, `__main__`): p = 113, d = 64,
4 heads, m = 512, dropout 0, 4 000 training pairs (of 6 441) and 2 000 validation pairs,
AdamW lr 1e-3, betas (0.9, 0.98), weight decay **4.0** (the function's default is 1.0), full
batch, init scale 1.0 (the function's default 0.1), seed 43 (data split by numpy seed 0), at
most 4 000 epochs, stopping once train and validation accuracy are both 1.0.

Training: full batch, `torch.optim.AdamW(lr, betas=(0.9, beta2), eps=1e-8, weight_decay=wd)`,
one step per epoch. The parameters are scaled by `--init-scale` after construction (ExPLAIND's
`scale_weights`). Metrics of epoch e are taken at w_e (before step e + 1): train loss and
accuracy from the training forward itself, held-out loss and accuracy from a no-grad forward
(every `--eval-every` epochs); the final state w_N is evaluated too (epoch N). Accuracy is the
argmax of the logits. Printed every `--print-every` epochs; `--json` writes the configuration,
every evaluated epoch, the epochs at which train and held-out accuracy first reached 0.5 / 0.99 /
1.0 (from every evaluated epoch), the wall time (training only, and with evaluation) and the command;
`--history-every K` keeps every K-th epoch's metrics in the JSON. `--stop-when-generalised N` ends the
run once held-out accuracy has been >= 0.99 at N consecutive evaluations (0: never);
`--max-seconds S` once S seconds have passed (the last state evaluated is then the one reached).

`--record DIR` records every state with our recorder (python/pathkernel_recorder's
TrajectoryRecorder; steps `step_00000.safetensors` ... with the state_dict names above, the token
ids as x (float64, exact integers), targets as int64 labels, the held-out pairs as the test set,
the AdamW hyper-parameters and the learning rate of every step; full batch). The model is written
as a pathkernel layer stack with a mapping of its tensor names (model kind `stack`, from
`GrokkingTransformer.pathkernel_stack()`):

    [embedding{vocab = p + 2, dim = d, scale = sqrt_dim}, self_attention{heads, head_dim = d/H,
     shared_qkv, bias = false}, last_token, residual[dense m, relu, dense d, relu],
     dense{p + 2, bias = false}]
    0.weight <- input_emb.weight, 1.head{h}_encoder.weight <- head{h}_encoder.weight,
    1.head{h}_decoder.weight <- head{h}_decoder.weight, 3.body.0.* <- linear1.*,
    3.body.2.* <- linear2.*, 4.weight <- decoder.weight

so that `pathkernel import --from torch DIR --out RUN` reads it (the import checks the mapping and
every tensor's shape). `DIR/grokking_model.json` holds the architecture (p, d, heads, m, the
forward above).

    python scripts/grokking_torch.py --restack REC OUT

rewrites a recording made before the recorder knew `pathkernel_stack()` (its model one module of
type `GrokkingTransformer`, which the import refuses, naming it): OUT gets a trajectory.json whose
model is the stack of REC/grokking_model.json (everything else unchanged) and symbolic links to
REC's step files and data.safetensors.
"""

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))


class GrokkingTransformer(nn.Module):
    """ExPLAIND's one-layer modular-addition transformer (see the module docstring)."""

    def __init__(self, p, d=64, heads=4, m=512):
        super().__init__()
        if d % heads:
            raise ValueError(f"d = {d} is not a multiple of heads = {heads}")
        self.p, self.d, self.heads, self.m = p, d, heads, m
        self.n_token = p + 2
        dh = d // heads
        self.input_emb = nn.Embedding(self.n_token, d)
        # ExPLAIND's unused `positional_encoding.pe = nn.Parameter(torch.randn(1, 10, d))`: drawn
        # and discarded, so that a seed gives their initial weights.
        torch.randn(1, 10, d)
        for h in range(1, heads + 1):
            setattr(self, f"head{h}_encoder", nn.Linear(d, dh, bias=False))
        for h in range(1, heads + 1):
            setattr(self, f"head{h}_decoder", nn.Linear(dh, d, bias=False))
        self.linear1 = nn.Linear(d, m)
        self.linear2 = nn.Linear(m, d)
        self.decoder = nn.Linear(d, self.n_token, bias=False)

    def attention(self, e):
        heads = []
        for h in range(1, self.heads + 1):
            q = getattr(self, f"head{h}_encoder")(e)
            heads.append(getattr(self, f"head{h}_decoder")(F.scaled_dot_product_attention(q, q, q)))
        return torch.stack(heads).sum(dim=0)

    def forward(self, x):
        """Token ids [n, 4] (any integer dtype, or floats holding integers) -> logits [n, p + 2]
        of the last position."""
        e = self.input_emb(x.long()) * math.sqrt(self.d)
        z = self.attention(e)[:, -1, :]
        r = z + F.relu(self.linear2(F.relu(self.linear1(z))))
        return self.decoder(r)

    def pathkernel_stack(self):
        """This module as a pathkernel layer stack (the recorder writes it as model kind `stack`):
        the layers in pathkernel's syntax and the name in this module's state_dict of each of the
        stack's parameters."""
        n, d, dh, m, heads = self.n_token, self.d, self.d // self.heads, self.m, self.heads
        layers = [{"embedding": {"vocab": n, "dim": d, "scale": "sqrt_dim"}},
                  {"self_attention": {"heads": heads, "head_dim": dh, "shared_qkv": True, "bias": False, "causal": False}},
                  "last_token",
                  {"residual": [{"dense": m}, "relu", {"dense": d}, "relu"]},
                  {"dense": {"features": n, "bias": False}}]
        names = {"0.weight": "input_emb.weight"}
        for h in range(1, heads + 1):
            names[f"1.head{h}_encoder.weight"] = f"head{h}_encoder.weight"
            names[f"1.head{h}_decoder.weight"] = f"head{h}_decoder.weight"
        names.update({"3.body.0.weight": "linear1.weight", "3.body.0.bias": "linear1.bias", "3.body.2.weight": "linear2.weight",
                      "3.body.2.bias": "linear2.bias", "4.weight": "decoder.weight"})
        return {"layers": layers, "names": names, "vocab": n}

    def spec(self):
        return {"kind": "explaind-modulo-transformer", "p": self.p, "n_token": self.n_token, "d": self.d, "heads": self.heads,
                "d_head": self.d // self.heads, "m": self.m, "sequence": ["a", "+ (p)", "b", "= (p+1)"],
                "forward": "e = input_emb(x)*sqrt(d); att = sum_h head{h}_decoder(SDPA(q,q,q)), q = head{h}_encoder(e), no mask, "
                           "no positions; z = att[:, -1]; r = z + relu(linear2(relu(linear1(z)))); logits = decoder(r); f = log_softmax(logits)",
                "parameters": {k: list(v.shape) for k, v in self.state_dict().items()}}


def modular_data(p, train_frac, data_seed):
    """(x_train, y_train, x_test, y_test): token ids [n, 4] int64 and targets int64; every pair
    a >= b once, split by a seeded permutation."""
    pairs = [(b, a) for a in range(p) for b in range(a, p)]  # ExPLAIND's order: larger residue first
    x = torch.tensor([[a, p, b, p + 1] for a, b in pairs], dtype=torch.int64)
    y = torch.tensor([(a + b) % p for a, b in pairs], dtype=torch.int64)
    perm = torch.from_numpy(np.random.default_rng(data_seed).permutation(len(pairs)))
    n_train = int(round(train_frac * len(pairs)))
    if not 0 < n_train < len(pairs):
        raise SystemExit(f"--train-frac {train_frac}: {n_train} of {len(pairs)} pairs for training")
    tr, te = perm[:n_train].sort().values, perm[n_train:].sort().values
    return x[tr], y[tr], x[te], y[te]


def build(p, d, heads, m, seed, init_scale, dtype):
    torch.manual_seed(seed)
    model = GrokkingTransformer(p, d, heads, m)
    if init_scale != 1.0:
        with torch.no_grad():
            for t in model.parameters():
                t.mul_(init_scale)
    return model.to(dtype)


def first(hist, key, level):
    for r in hist:
        if r.get(key) is not None and r[key] >= level:
            return r["epoch"]
    return None


def train(a, log=print):
    torch.set_num_threads(a.threads)
    dtype = torch.float64 if a.dtype == "float64" else torch.float32
    xtr, ytr, xte, yte = modular_data(a.p, a.train_frac, a.data_seed)
    model = build(a.p, a.d, a.heads, a.m, a.seed, a.init_scale, dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, a.beta2), eps=1e-8, weight_decay=a.wd)
    rec = None
    if a.record:
        sys.path.insert(0, os.path.join(here, "..", "python", "pathkernel_recorder"))
        from pathkernel_recorder.recorder import TrajectoryRecorder

        rec = TrajectoryRecorder(a.record, model, xtr, ytr, xte, yte, loss="cross_entropy", optimizer=opt,
                                 description=f"grokking_torch.py: a + b mod {a.p}, ExPLAIND's one-layer transformer d {a.d}, {a.heads} heads, "
                                             f"m {a.m}; full-batch AdamW lr {a.lr} wd {a.wd} betas (0.9, {a.beta2}); seed {a.seed}, data seed {a.data_seed}, {a.dtype}")
        with open(os.path.join(a.record, "grokking_model.json"), "w") as f:
            json.dump(dict(model.spec(), config=vars(a)), f, indent=1)
        rec.start()
    n_par = sum(t.numel() for t in model.parameters())
    log(f"a + b mod {a.p}: {len(ytr)} training pairs, {len(yte)} held out; d {a.d}, {a.heads} heads, m {a.m}: {n_par} parameters, {a.dtype}; "
        f"AdamW lr {a.lr} wd {a.wd} betas (0.9, {a.beta2}); {a.epochs} epochs")
    hist = []
    t0 = time.time()
    t_eval = 0.0
    streak = 0

    def held_out():
        nonlocal t_eval
        te0 = time.time()
        with torch.no_grad():
            lo = model(xte)
            r = F.cross_entropy(lo, yte).item(), (lo.argmax(1) == yte).double().mean().item()
        t_eval += time.time() - te0
        return r

    epoch = 0
    for epoch in range(a.epochs + 1):
        last = epoch == a.epochs
        if last:
            with torch.no_grad():
                logits = model(xtr)
                loss = F.cross_entropy(logits, ytr)
        else:
            opt.zero_grad()
            logits = model(xtr)
            loss = F.cross_entropy(logits, ytr)
        row = {"epoch": epoch, "train_loss": loss.item(), "train_acc": (logits.argmax(1) == ytr).double().mean().item()}
        if last or epoch % a.eval_every == 0:
            row["test_loss"], row["test_acc"] = held_out()
            streak = streak + 1 if row["test_acc"] >= 0.99 else 0
        hist.append(row)
        if a.print_every and (epoch % a.print_every == 0 or last):
            log(f"epoch {epoch:6d}  train loss {row['train_loss']:.3e} acc {row['train_acc']:.4f}  held-out loss "
                f"{row.get('test_loss', float('nan')):.3e} acc {row.get('test_acc', float('nan')):.4f}  {time.time() - t0:7.1f} s", flush=True)
        if last:
            break
        evaluated = "test_acc" in row
        if evaluated and a.stop_when_generalised and streak >= a.stop_when_generalised:
            log(f"held-out accuracy >= 0.99 at {streak} consecutive evaluations: stopping at epoch {epoch}")
            break
        if evaluated and a.max_seconds and time.time() - t0 > a.max_seconds:
            log(f"--max-seconds {a.max_seconds}: stopping at epoch {epoch}")
            break
        loss.backward()
        opt.step()
        if rec is not None:
            rec.step(batch=None)
    wall = time.time() - t0
    if rec is not None:
        rec.finish()
    marks = {f"{k}_{lvl}": first(hist, f"{k}_acc", lvl) for k in ("train", "test") for lvl in (0.5, 0.99, 1.0)}
    fin = hist[-1]
    out = {"config": {k: v for k, v in vars(a).items() if k not in ("json", "check_explaind")}, "parameters": n_par,
           "n_train": len(ytr), "n_test": len(yte), "epochs_run": fin["epoch"], "wall_s": wall, "eval_s": t_eval, "train_s": wall - t_eval,
           "s_per_epoch": (wall - t_eval) / max(fin["epoch"], 1), "first_epoch": marks, "final": fin,
           "model": model.spec(), "torch": torch.__version__, "threads": torch.get_num_threads(),
           "command": "python scripts/grokking_torch.py " + " ".join(sys.argv[1:]), "history_every": a.history_every,
           "history": [r for r in hist if r["epoch"] % a.history_every == 0 or r is fin]}
    m99, g99 = marks["train_0.99"], marks["test_0.99"]
    out["grokked"] = bool(g99 is not None and fin.get("test_acc", 0) >= 0.99 and m99 is not None)
    log(f"train acc >= 0.99 at epoch {m99}, 1.0 at {marks['train_1.0']}; held-out >= 0.5 at {marks['test_0.5']}, >= 0.99 at {g99}, "
        f"1.0 at {marks['test_1.0']}; final held-out acc {fin.get('test_acc'):.4f}; {wall:.1f} s ({out['s_per_epoch'] * 1e3:.2f} ms per step)")
    if a.json:
        os.makedirs(os.path.dirname(os.path.abspath(a.json)), exist_ok=True)
        with open(a.json, "w") as f:
            json.dump(out, f)
    return out, model


def check_explaind(seed=3):
    """Our module against ExPLAIND's SingleLayerTransformerClassifier (explaind 0.1.0): the same
    initial weights under one seed (pe aside), the same log-softmax on every pair, float64."""
    from explaind.modulo_model.model import SingleLayerTransformerClassifier

    torch.set_num_threads(1)
    worst = 0.0
    for p, d, m in ((13, 16, 32), (23, 64, 128)):
        torch.manual_seed(seed)
        theirs = SingleLayerTransformerClassifier(p + 2, d_model=d, nhead=4, dim_mlp=m, dropout=0.0).double().eval()
        torch.manual_seed(seed)
        ours = GrokkingTransformer(p, d, 4, m).double()
        ts, os_ = theirs.state_dict(), ours.state_dict()
        extra = sorted(set(ts) - set(os_))
        assert extra == ["positional_encoding.pe"], extra
        assert list(os_) == [k for k in ts if k != "positional_encoding.pe"], (list(os_), list(ts))
        init = max(float((ts[k] - v).abs().max()) for k, v in os_.items())
        # trained-looking weights: perturb, then compare forwards on every pair
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for v in theirs.parameters():
                v.add_(0.3 * torch.randn(v.shape, generator=g, dtype=v.dtype))
        ours.load_state_dict({k: v for k, v in theirs.state_dict().items() if k != "positional_encoding.pe"})
        x, _, xt, _ = modular_data(p, 0.5, 0)
        x = torch.cat([x, xt]).int()
        with torch.no_grad():
            f_theirs = theirs(x)
            f_ours = F.log_softmax(ours(x), dim=-1)
        diff = float((f_theirs - f_ours).abs().max())
        worst = max(worst, diff)
        print(f"p {p}, d {d}, m {m}: initial weights differ by {init:.3g} (0 expected); log-softmax on {len(x)} pairs differs by {diff:.3g}; "
              f"max |f| {float(f_theirs.abs().max()):.3g}")
        assert init == 0.0 and diff < 1e-12
    print(f"ok: our GrokkingTransformer is ExPLAIND's SingleLayerTransformerClassifier (largest difference {worst:.3g})")


def restack(rec, out):
    """`--restack REC OUT`: REC's recording with its model entry replaced by the stack of
    REC/grokking_model.json (see the module docstring); the states and data linked, not copied."""
    sys.path.insert(0, os.path.join(here, "..", "python", "pathkernel_recorder"))
    from pathkernel_recorder.recorder import describe_model

    rec = os.path.abspath(rec)
    with open(os.path.join(rec, "grokking_model.json")) as f:
        spec = json.load(f)
    if spec.get("kind") != "explaind-modulo-transformer":
        raise SystemExit(f"{rec}/grokking_model.json: kind {spec.get('kind')!r}, expected explaind-modulo-transformer")
    with open(os.path.join(rec, "trajectory.json")) as f:
        traj = json.load(f)
    model = GrokkingTransformer(spec["p"], spec["d"], spec["heads"], spec["m"])
    shapes = {k: list(v.shape) for k, v in model.state_dict().items()}
    if shapes != spec["parameters"]:
        raise SystemExit(f"{rec}/grokking_model.json: parameters {spec['parameters']} are not GrokkingTransformer's {shapes}")
    was = traj["model"]
    if not (was.get("kind") == "stack" or (was.get("kind") == "layers" and [m.get("type") for m in was.get("modules", [])] == ["GrokkingTransformer"])):
        raise SystemExit(f"{rec}/trajectory.json: model {was} is not the one GrokkingTransformer module")
    traj["model"] = describe_model(model, was.get("input", [4]))
    os.makedirs(out, exist_ok=True)
    if os.listdir(out):
        raise SystemExit(f"{out} is not empty")
    for name in sorted(os.listdir(rec)):
        if name.endswith(".safetensors"):
            os.symlink(os.path.join(rec, name), os.path.join(out, name))
    with open(os.path.join(out, "trajectory.json"), "w") as f:
        json.dump(traj, f)
    print(f"{out}: {rec}'s recording with model {json.dumps(traj['model'])[:200]}...")


def parser():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--p", type=int, default=31)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--m", type=int, default=256)
    ap.add_argument("--train-frac", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0, help="torch seed of the initialisation")
    ap.add_argument("--data-seed", type=int, default=0, help="numpy seed of the train / held-out split")
    ap.add_argument("--epochs", type=int, default=5000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--wd", type=float, default=1.0)
    ap.add_argument("--beta2", type=float, default=0.98)
    ap.add_argument("--init-scale", type=float, default=1.0)
    ap.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    ap.add_argument("--eval-every", type=int, default=1)
    ap.add_argument("--stop-when-generalised", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=0, help="stop after this wall time (0: no limit)")
    ap.add_argument("--print-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--history-every", type=int, default=1, help="the JSON keeps every K-th epoch's metrics (and the last)")
    ap.add_argument("--record")
    ap.add_argument("--check-explaind", action="store_true")
    ap.add_argument("--restack", nargs=2, metavar=("REC", "OUT"), help="REC's recording with the model written as a pathkernel stack, in OUT")
    return ap


def main():
    a = parser().parse_args()
    if a.check_explaind:
        check_explaind()
        return
    if a.restack:
        restack(*a.restack)
        return
    train(a)


if __name__ == "__main__":
    main()
