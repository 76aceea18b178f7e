"""The table of bench/grokking/sweep.md from bench/grokking/raw/*.json (one per sweep point, written
by scripts/grokking_torch.py through bench/grokking/run.sh).

    python3 bench/grokking/summarise.py > bench/grokking/table.md
"""

import glob
import json
import os

here = os.path.dirname(os.path.abspath(__file__))


def main():
    rows = []
    for path in sorted(glob.glob(os.path.join(here, "raw", "*.json"))):
        with open(path) as f:
            r = json.load(f)
        c, m, fin = r["config"], r["first_epoch"], r["final"]
        mem, gen = m["train_0.99"], m["test_0.99"]
        # held-out accuracy at the last evaluation at or before memorisation (train acc >= 0.99)
        at_mem = None
        if mem is not None:
            at_mem = [h["test_acc"] for h in r["history"] if h["epoch"] <= mem and "test_acc" in h][-1]
        rows.append((os.path.basename(path)[:-5], c, r, m, fin, mem, gen, at_mem))
    head = ["run", "p", "d", "H", "m", "train frac (n)", "lr", "wd", "init", "epochs run", "train acc ≥ 0.99 at", "held-out acc then", "held-out ≥ 0.5 at",
            "held-out ≥ 0.99 at", "final held-out acc", "grokked", "wall s", "ms / epoch"]
    head[head.index("grokked")] = "verdict"
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, c, r, m, fin, mem, gen, at_mem in rows:
        gap = f" ({gen / mem:.1f}× later)" if gen and mem else ""
        # grokking: generalised (>= 0.99, and still at the end) at least twice as late as it
        # memorised, having held out less than half right when it memorised
        grok = r["grokked"] and at_mem is not None and at_mem < 0.5 and gen >= 2 * mem
        verdict = ("grokked" if grok else "generalised, no delay") + gap if r["grokked"] else "no"
        print(f"| {name} | {c['p']} | {c['d']} | {c['heads']} | {c['m']} | {c['train_frac']} ({r['n_train']}) | {c['lr']:g} | {c['wd']:g} | "
              f"{c.get('init_scale', 1.0):g} | {r['epochs_run']} | {mem} | {'' if at_mem is None else f'{at_mem:.3f}'} | {m['test_0.5']} | {gen} | "
              f"{fin['test_acc']:.3f} | {verdict} | {r['wall_s']:.0f} | {1e3 * r['wall_s'] / max(r['epochs_run'], 1):.1f} |")


if __name__ == "__main__":
    main()
