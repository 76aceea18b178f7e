#!/usr/bin/env python3
"""Every figure the README's "Shipped studies" table quotes must be in the study's report.

For each row `| `NAME` | what | headline |`, every number in the headline (2.1e-14, 93.5 %, 0.742,
4.51, 1 000) must equal, at the precision the headline writes it, some number in
`reports/NAME/summary.md`, the report the study writes (its other files are not searched: a
figure that only a raw JSON holds is not a claim the report makes). A quoted figure the summary
does not hold is printed with the row, and the script exits 1.

    python3 scripts/check_readme_figures.py [README.md]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
NUMBER = re.compile(r"(?<![\w.])[-+−]?\d[\d ]*(?:\.\d+)?(?:e[-+−]?\d+)?(?![\w])")


def numbers(text):
    """Every number in `text` as (value, written form); thin spaces in thousands are joined."""
    out = []
    for m in NUMBER.finditer(text):
        raw = m.group(0).replace("−", "-").strip()
        # "1 000" is one number; "0.742, TRAK-10 0.701" are two (the space then precedes a digit
        # group of exactly three only in thousands).
        parts = raw.split(" ")
        if len(parts) > 1 and all(len(p) == 3 and p.isdigit() for p in parts[1:]) and parts[0].isdigit():
            cands = ["".join(parts)]
        else:
            cands = parts
        for c in cands:
            if not c:
                continue
            try:
                out.append((float(c), c))
            except ValueError:
                pass
    return out


def precision(written):
    """The rounding step of a number as written: 2.1e-14 -> 1e-15, 93.5 -> 0.1, 1000 -> 1."""
    mant, _, exp = written.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    return 10.0 ** (-decimals + (int(exp) if exp else 0))


def held(value, written, pool):
    step = precision(written)
    return any(abs(v - value) <= 0.5 * step * (1 + 1e-9) or abs(abs(v) - abs(value)) <= 0.5 * step * (1 + 1e-9) for v in pool)


def main():
    readme = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "README.md"
    text = readme.read_text()
    section = text.split("## Shipped studies", 1)[1].split("\n## ", 1)[0]
    bad, checked = [], 0
    for line in section.splitlines():
        m = re.match(r"\| `([\w-]+)` \| (.*) \| (.*) \|$", line)
        if not m:
            continue
        name, headline = m.group(1), m.group(3)
        summary = ROOT / "reports" / name / "summary.md"
        if not summary.is_file():
            bad.append(f"{name}: no reports/{name}/summary.md")
            continue
        pool = [v for v, _ in numbers(summary.read_text(errors="replace"))]
        # Percentages in a report are often fractions (0.935 for 93.5 %).
        pool += [100 * v for v in pool]
        for value, written in numbers(re.sub(r"\(.*?\)", lambda g: g.group(0), headline)):
            checked += 1
            if not held(value, written, pool):
                bad.append(f"{name}: `{written}` of \"{headline}\" is not in reports/{name}/summary.md")
    for b in bad:
        print(b)
    print(f"{checked} figures checked in {readme.name}'s study table, {len(bad)} not found in the studies' summaries")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
