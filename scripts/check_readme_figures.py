#!/usr/bin/env python3
"""Every figure the README's "Shipped studies" table quotes must be in the study's report.

For each row `| `NAME` | what | headline |`, every number in the headline (2.1e-14, 93.5 %, 0.742,
4.51, 1 000) must equal, at the precision the headline writes it, some number in
`reports/NAME/summary.md`, the report the study writes (its other files are not searched: a
figure that only a raw JSON holds is not a claim the report makes). A quoted figure the summary
does not hold is printed with the row, and the script exits 1.

The README's prose is checked too. Each paragraph or list item outside code, headings and tables
is split into sentences; a sentence's sources are the reports it names (`reports/NAME`: its
summary.md and timings.md, both written by the study), the GPU runs it names (`bench/gpu/DIR`:
the text files of that run) and the guide pages it links (`docs/src/PAGE.md`); a sentence that
names none takes the reports and GPU runs its paragraph names. Every figure written with a
decimal point or an exponent (2.688, 3.5e-13, 0.47×) in a sentence with sources must be held by
them, at its written precision, as above; integers (sizes, counts of the setup) are not checked.
A figure is held when any number of its sources rounds to it: this catches figures no source
holds (stale or mistyped ones), not a figure quoted for the wrong row of a large report.

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


def prose_blocks(text):
    """The README's paragraphs and list items, each joined into one line, without code blocks,
    indented code, headings and table rows."""
    blocks, cur, fenced = [], [], False
    # An indented line is code when it opens after a blank line (or continues code); after a
    # line of text it continues that paragraph or list item.
    prev_blank, prev_code = True, False

    def close():
        if cur:
            blocks.append(" ".join(cur))
            cur.clear()

    for line in text.splitlines():
        code = line.startswith("    ") and (prev_blank or prev_code)
        prev_blank, prev_code = not line.strip(), code or (prev_code and not line.strip())
        if line.startswith("```"):
            fenced = not fenced
            close()
            continue
        if fenced or code or line.lstrip().startswith(("|", "#")):
            close()
            continue
        if not line.strip() or re.match(r"\s*[-*] ", line):
            close()
        if line.strip():
            cur.append(line.strip())
    close()
    return blocks


def sources(text):
    """The sources `text` names: (kind, name) for reports, GPU runs and guide pages that exist."""
    out = [("report", n) for n in re.findall(r"reports/([\w-]+)", text) if (ROOT / "reports" / n / "summary.md").is_file()]
    out += [("bench", n) for n in re.findall(r"bench/gpu/([\w.-]+)", text) if (ROOT / "bench" / "gpu" / n).is_dir()]
    out += [("guide", n) for n in re.findall(r"docs/src/([\w-]+\.md)", text) if (ROOT / "docs" / "src" / n).is_file()]
    return out


def source_files(src):
    kind, name = src
    if kind == "report":
        return [p for p in (ROOT / "reports" / name / f for f in ("summary.md", "timings.md")) if p.is_file()]
    if kind == "bench":
        return sorted(p for p in (ROOT / "bench" / "gpu" / name).rglob("*") if p.is_file() and p.suffix in (".md", ".txt", ".json", ".jsonl", ".log"))
    return [ROOT / "docs" / "src" / name]


def check_prose(text):
    """(figures checked, figures not held) over the README's prose; see the module's doc."""
    bad, checked, pools = [], 0, {}
    for block in prose_blocks(text):
        inherited = [x for x in sources(block) if x[0] != "guide"]
        for sentence in re.split(r"(?<=[.;:!?])\s+(?=[A-Z*(`])", block):
            srcs = sources(sentence) or inherited
            if not srcs:
                continue
            pool = []
            for src in srcs:
                if src not in pools:
                    vals = [v for f in source_files(src) for v, _ in numbers(f.read_text(errors="replace"))]
                    pools[src] = vals + [100 * v for v in vals]
                pool += pools[src]
            for value, written in numbers(sentence):
                if "." not in written and "e" not in written.lower():
                    continue
                checked += 1
                if not held(value, written, pool):
                    i = sentence.find(written)
                    names = ", ".join(f"{k} {n}" for k, n in srcs)
                    bad.append(f"prose: `{written}` in \"…{sentence[max(0, i - 70):i + len(written) + 20]}…\" is not in its sources ({names})")
    return checked, bad


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
    prose_checked, prose_bad = check_prose(text)
    for b in bad + prose_bad:
        print(b)
    print(f"{checked} figures checked in {readme.name}'s study table, {len(bad)} not found in the studies' summaries")
    print(f"{prose_checked} figures checked in {readme.name}'s prose, {len(prose_bad)} not found in the sources their sentences name")
    return 1 if bad or prose_bad else 0


if __name__ == "__main__":
    sys.exit(main())
