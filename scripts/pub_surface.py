#!/usr/bin/env python3
"""Which `pub` items of the library are used from outside it, and which could be `pub(crate)`.

    python3 scripts/pub_surface.py            # every pub item: KEEP (and why) or CRATE
    python3 scripts/pub_surface.py --summary  # the counts only
    python3 scripts/pub_surface.py --apply    # rewrite `pub` -> `pub(crate)` on the CRATE items

Items: lines of src/ (outside `#[cfg(test)]` modules, comments and strings blanked, as
`code_map.py` reads them) that start with `pub fn|struct|enum|trait|type|const|static|union`
(methods in `impl` blocks included) and `pub mod`. `pub use` lines are left alone.

Outside the library (a separate crate compiles it): `src/main.rs` (the binary; `src/cli/` is a
module of the library, behind the `cli` feature, so it counts as inside), `tests/**/*.rs` (the
fuzz targets too), `notebooks-evcxr/*.rs` and the code cells of `notebooks-evcxr/*.ipynb`, the
doctests in `src/` (`///`/`//!` lines inside ``` blocks), the rust code blocks of
`docs/src/*.md` and `README.md`.

The rule (name matching by identifier, deliberately conservative):
1. every `pub` item in `src/api/` stays `pub` (the notebook front door), and so does every item
   `src/api/mod.rs` re-exports, with the inherent methods of the types among them; `evcxr_display`
   methods stay `pub` (evcxr calls them by name);
2. an item whose NAME occurs as an identifier anywhere in the outside text stays `pub`. A method
   called `new`, `len` or `compute` therefore stays `pub` whenever any outside code writes that
   word, whatever type it was called on: when unsure, keep;
3. ... except a method of an inherent `impl` of a type that is itself not kept: nothing outside can
   name the type, so its methods are internal whatever their names;
4. what a kept item's signature names (a fn's header up to its body, a struct's or enum's whole
   body, a type alias, a const's type, a trait's body) stays `pub` too, repeated to a fixed point;
5. items in FROZEN files are not touched (and count as kept for rule 4);
6. `pub mod m` becomes `pub(crate) mod m` when no item under it is kept, nothing outside writes
   `m::` and the module is not under a kept-and-named path.
Everything else is a candidate for `pub(crate)`. The compiler has the last word: after --apply,
`cargo test --release --no-run` and `cargo doc` show what must go back to `pub`; those restorations
are listed in KEEP_ANYWAY below with the reason.

Standard library only; deterministic output.
"""
import json
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import code_map  # noqa: E402  (blank(), match_brace(), the crate loader)

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

# Files other work is editing now: their `pub` stays as it is.
FROZEN_PREFIXES = ("attribution/", "datamodels/")
FROZEN = {
    "report/svm.rs", "report/stationarity.rs", "report/mod.rs", "study/analyses.rs",
    "study/config.rs", "api/fit.rs", "analysis/farfield.rs", "analysis/mod.rs",
}

# (file, name): items the compiler or rustdoc needed `pub` although the name rule above made them
# candidates; each with the reason. Filled in after compiling the applied result.
KEEP_ANYWAY = {
    # Used by the unit tests only, kept `pub` as the documented method or loader of a public type
    # (the brief allows `pub` or `#[cfg(test)] pub(crate)`; these are public API a notebook may
    # call, and the module docs link to them).
    ("gp/regression.rs", "predict_cov"): "tests only; the GP's posterior covariance, linked from the module docs",
    ("gp/functional.rs", "log_evidence"): "tests only; the evidence at any δ of a public type",
    ("data/idx.rs", "load_mnist"): "tests only; the public MNIST loader (the `idx` data kind's)",
    ("data/idx.rs", "load_mnist_per_class"): "tests only; the public per-class MNIST loader",
}

# Method names called by a tool outside the code: evcxr calls `evcxr_display` on a cell's value.
CALLED_BY_NAME = {"evcxr_display"}

ITEM = re.compile(
    r"^([ \t]*)pub[ \t]+((?:(?:const|async|unsafe|default|extern(?:[ \t]+\"?[A-Za-z]*\"?)?)[ \t]+)*)"
    r"(fn|struct|enum|trait|type|const|static|mod|union)\b[ \t]*(" + IDENT + r")",
    re.M,
)
IMPL = re.compile(r"\bimpl\b")


def frozen(rel):
    return rel in FROZEN or rel.startswith(FROZEN_PREFIXES)


# ------------------------------------------------------------------------------------------------
# The outside text.


def doctest_lines(text):
    out, inside = [], False
    for line in text.splitlines():
        s = line.strip()
        if not (s.startswith("///") or s.startswith("//!")):
            inside = False
            continue
        body = s[3:].strip()
        if body.startswith("```"):
            inside = not inside
            continue
        if inside:
            out.append(body[2:] if body.startswith("# ") else body)
    return out


def md_rust_blocks(text):
    out, inside = [], False
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("```"):
            if inside:
                inside = False
            else:
                lang = s[3:].strip().split(",")[0]
                inside = lang in ("", "rust", "no_run", "ignore", "should_panic")
            continue
        if inside:
            out.append(line)
    return out


def outside_sources():
    """[(label, text)]: the code outside the library."""
    out = [("src/main.rs", (SRC / "main.rs").read_text(encoding="utf-8"))]
    for p in sorted((ROOT / "tests").rglob("*.rs")):
        if "/target/" in p.as_posix():
            continue
        out.append((p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")))
    for p in sorted((ROOT / "notebooks-evcxr").glob("*.rs")):
        out.append((p.relative_to(ROOT).as_posix(), p.read_text(encoding="utf-8")))
    for p in sorted((ROOT / "notebooks-evcxr").glob("*.ipynb")):
        nb = json.loads(p.read_text(encoding="utf-8"))
        cells = ["".join(c.get("source", [])) for c in nb.get("cells", []) if c.get("cell_type") == "code"]
        out.append((p.relative_to(ROOT).as_posix(), "\n".join(cells)))
    for p in sorted(SRC.rglob("*.rs")):
        lines = doctest_lines(p.read_text(encoding="utf-8"))
        if lines:
            out.append(("doctests of " + p.relative_to(ROOT).as_posix(), "\n".join(lines)))
    for p in sorted((ROOT / "docs" / "src").glob("*.md")) + [ROOT / "README.md"]:
        lines = md_rust_blocks(p.read_text(encoding="utf-8"))
        if lines:
            out.append((p.relative_to(ROOT).as_posix(), "\n".join(lines)))
    return out


# ------------------------------------------------------------------------------------------------
# The items.


class Item:
    def __init__(self, rel, line, kind, name, start, sig, impl_of, mod_path):
        self.rel, self.line, self.kind, self.name = rel, line, kind, name
        self.start = start        # offset of `pub` in the file
        self.sig = sig            # the text whose names a kept item makes public (rule 4)
        self.impl_of = impl_of    # the self type of the inherent impl holding a method, or None
        self.mod_path = mod_path  # for `pub mod`: its module path (tuple)
        self.keep = None          # the reason it stays pub, or None


def impl_ranges(code):
    """[(start, end, self type name or None for trait impls)] of the `impl` blocks."""
    out = []
    for m in IMPL.finditer(code):
        # an item-level impl: `impl` at the start of a line (after indentation / `unsafe`)
        ls = code.rfind("\n", 0, m.start()) + 1
        if not re.fullmatch(r"[ \t]*(?:unsafe[ \t]+)?", code[ls:m.start()]):
            continue
        brace = code.find("{", m.end())
        semi = code.find(";", m.end())
        if brace < 0 or (0 <= semi < brace):
            continue
        header = code[m.end():brace]
        header = re.sub(r"\bwhere\b.*", "", header, flags=re.S)
        header = strip_generics(header)
        if re.search(r"\bfor\b", header):
            ty = None
        else:
            names = re.findall(IDENT, header)
            names = [n for n in names if n not in ("dyn", "mut", "const")]
            ty = names[-1] if names else None
            # `impl Foo<..>`: generics were stripped, the last identifier is the type
        out.append((brace, code_map.match_brace(code, brace), ty))
    return out


def strip_generics(s):
    out, depth = [], 0
    for ch in s:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def signature(code, m, kind):
    start = m.end()
    if kind == "fn":
        brace = code.find("{", start)
        semi = code.find(";", start)
        end = min(x for x in (brace, semi) if x >= 0)
        return code[start:end]
    if kind in ("struct", "enum", "union", "trait"):
        brace = code.find("{", start)
        semi = code.find(";", start)
        if brace >= 0 and (semi < 0 or brace < semi):
            return code[start:code_map.match_brace(code, brace)]
        return code[start:semi]
    if kind in ("type", "const", "static"):
        return code[start:code.find(";", start)]
    return ""


def collect(crate):
    items = []
    for rel, sf in sorted(crate.files.items()):
        code = sf.code
        impls = impl_ranges(code)
        for m in ITEM.finditer(code):
            prefix, kind, name = m.group(2), m.group(3), m.group(4)
            if kind == "const" and name == "fn":
                continue  # handled by the `const` prefix group below
            if "const" in prefix.split() and kind == "fn":
                pass
            start = m.start() + len(m.group(1))
            impl_of = None
            for a, b, ty in impls:
                if a < start < b:
                    impl_of = ty or "<trait>"
            mod_path = None
            if kind == "mod":
                base = sf.module if not rel.endswith(("mod.rs", "lib.rs")) and rel != "lib.rs" else sf.module
                mod_path = tuple(base) + (name,)
            items.append(Item(rel, code.count("\n", 0, start) + 1, kind, name, start,
                              signature(code, m, kind), impl_of, mod_path))
    return items


def api_reexports():
    """Names `src/api/mod.rs` re-exports with `pub use`."""
    code = code_map.blank((SRC / "api" / "mod.rs").read_text(encoding="utf-8"))
    names = set()
    for m in re.finditer(r"\bpub\s+use\s+([^;]*);", code):
        for n in re.findall(IDENT, m.group(1)):
            names.add(n)
    return names


def classify(crate):
    """The items, each with `keep` set to the reason it stays pub or None."""
    items = collect(crate)
    outside = outside_sources()
    words = set()
    paths = set()  # `m::` prefixes written outside
    for _, text in outside:
        words.update(re.findall(IDENT, text))
        paths.update(re.findall(r"(" + IDENT + r")\s*::", text))
    api_names = api_reexports()

    types = {}  # name -> items (non-methods)
    for it in items:
        if it.impl_of is None and it.kind != "mod":
            types.setdefault(it.name, []).append(it)

    for it in items:
        if it.kind == "mod":
            continue
        if frozen(it.rel):
            it.keep = "frozen file"
        elif it.rel.startswith("api/"):
            it.keep = "in src/api/"
        elif (it.rel, it.name) in KEEP_ANYWAY:
            it.keep = KEEP_ANYWAY[(it.rel, it.name)]
        elif it.name in CALLED_BY_NAME:
            it.keep = "called by name by evcxr"
        elif it.impl_of is None and it.name in api_names:
            it.keep = "re-exported by api/mod.rs"
        elif it.impl_of is None and it.name in words:
            it.keep = "named outside"

    # `pub use` re-exports: a frozen file's re-export keeps its targets pub (E0364 otherwise).
    for u in reexports(crate, items):
        if frozen(u.rel) or u.rel == "api/mod.rs":
            for name, target in u.targets:
                if target is not None and not target.keep:
                    target.keep = "re-exported by a frozen file" if frozen(u.rel) else "re-exported by api/mod.rs"

    # Rule 1 for methods: the inherent methods of a type api/mod.rs re-exports are the methods of a
    # value a notebook holds.
    for it in items:
        if not it.keep and it.impl_of in api_names:
            it.keep = f"method of {it.impl_of}, re-exported by api/mod.rs"

    def type_kept(name):
        return any(t.keep for t in types.get(name, []))

    # Methods, and rule 4, to a fixed point.
    changed = True
    while changed:
        changed = False
        for it in items:
            if it.kind == "mod" or it.keep:
                continue
            if it.impl_of is not None and it.impl_of != "<trait>":
                if type_kept(it.impl_of) and (it.name in words or it.name in CALLED_BY_NAME):
                    it.keep = f"named outside (method of kept {it.impl_of})"
                    changed = True
        kept_sig_names = set()
        for it in items:
            if it.keep and it.kind != "mod":
                if it.impl_of is not None and it.impl_of != "<trait>" and not type_kept(it.impl_of):
                    continue
                kept_sig_names.update(re.findall(IDENT, it.sig))
        for it in items:
            if it.kind == "mod" or it.keep or it.impl_of is not None:
                continue
            if it.name in kept_sig_names:
                it.keep = "named in a kept item's signature"
                changed = True

    # Modules.
    for it in items:
        if it.kind != "mod":
            continue
        mp = it.mod_path
        inner = [x for x in items if x is not it and crate.files[x.rel].module[:len(mp)] == mp]
        kept_inner = [x for x in inner if x.keep and x.kind != "mod"]
        if frozen(it.rel):
            it.keep = "frozen file"
        elif it.rel.startswith("api/"):
            it.keep = "in src/api/"
        elif (it.rel, it.name) in KEEP_ANYWAY:
            it.keep = KEEP_ANYWAY[(it.rel, it.name)]
        elif it.name in paths:
            it.keep = "module path written outside"
        elif kept_inner:
            it.keep = f"holds kept items ({kept_inner[0].name}, ..)"
    return items


class Reexport:
    """One `pub use PREFIX::{a, b as c, ..};` (or `pub use PREFIX::a;`) line of src/."""

    def __init__(self, rel, start, end, prefix, entries):
        self.rel, self.start, self.end = rel, start, end
        self.prefix = prefix      # the path before the braces, `::` included (or "")
        self.entries = entries    # [(entry text, name)]
        self.targets = []         # [(name, Item or None)]


def module_files(crate, rel, segs):
    """The src-relative files that can define items of the module named by `segs` from `rel`."""
    mp = list(crate.files[rel].module)
    if segs and segs[0] == "crate":
        mp, segs = [], segs[1:]
    elif segs and segs[0] == "super":
        while segs and segs[0] == "super":
            mp, segs = mp[:-1], segs[1:]
    elif segs and segs[0] == "self":
        segs = segs[1:]
    full = tuple(mp + list(segs))
    return [r for r, sf in crate.files.items() if sf.module[:len(full)] == full]


def reexports(crate, items):
    out = []
    for rel, sf in sorted(crate.files.items()):
        for m in re.finditer(r"^[ \t]*pub[ \t]+use[ \t]+([^;{]*?)(\{[^;]*\}|" + IDENT + r"(?:[ \t]+as[ \t]+" + IDENT + r")?|\*)[ \t]*;", sf.code, re.M):
            prefix, tail = m.group(1), m.group(2)
            if tail == "*":
                continue
            entries = [e.strip() for e in tail.strip("{}").split(",") if e.strip()] if tail.startswith("{") else [tail]
            u = Reexport(rel, m.start() + len(m.group(0)) - len(m.group(0).lstrip()), m.end(), prefix,
                         [(e, e.split()[0]) for e in entries])
            segs = [x for x in prefix.split("::") if x.strip()]
            files = module_files(crate, rel, [x.strip() for x in segs])
            for _, name in u.entries:
                if name == "self":
                    u.targets.append((name, None))
                    continue
                cands = [it for it in items if it.name == name and it.impl_of is None and it.rel in files]
                u.targets.append((name, cands[0] if cands else None))
            out.append(u)
    return out


def rewrite_reexports(crate, items):
    """Split each non-frozen `pub use` whose targets are partly internal; returns the edits
    [(rel, start, end, new text)]."""
    edits = []
    for u in reexports(crate, items):
        if frozen(u.rel) or u.rel == "api/mod.rs":
            continue
        internal = [e for (e, _), (_, t) in zip(u.entries, u.targets) if t is not None and not t.keep]
        public = [e for e, _ in u.entries if e not in internal]
        if not internal:
            continue
        indent = ""
        def stmt(vis, es):
            body = es[0] if len(es) == 1 else "{" + ", ".join(es) + "}"
            return f"{vis} use {u.prefix}{body};"
        new = [stmt("pub", public)] if public else []
        new.append(stmt("pub(crate)", internal))
        edits.append((u.rel, u.start, u.end, "\n".join(new)))
    return edits


def apply(items, edits):
    """Rewrites `pub ` to `pub(crate) ` on the candidates and applies the `pub use` edits."""
    by_file = {}
    for it in items:
        if not it.keep:
            by_file.setdefault(it.rel, []).append((it.start, it.start + 4, "pub(crate) "))
    for rel, a, b, new in edits:
        by_file.setdefault(rel, []).append((a, b, new))
    for rel, es in sorted(by_file.items()):
        p = SRC / rel
        text = p.read_text(encoding="utf-8")
        for a, b, new in sorted(es, key=lambda e: -e[0]):
            assert text[a:a + 4] == "pub ", (rel, a, text[a:a + 30])
            text = text[:a] + new + text[b:]
        p.write_text(text, encoding="utf-8")


def main(argv):
    crate = code_map.Crate(SRC)
    items = classify(crate)
    if "--apply" in argv:
        edits = rewrite_reexports(crate, items)
        apply(items, edits)
        print(f"rewrote {sum(1 for x in items if not x.keep)} items to pub(crate), "
              f"{len(edits)} `pub use` lines (split or made pub(crate))")
        return 0
    keep = [x for x in items if x.keep]
    cand = [x for x in items if not x.keep]
    if "--summary" not in argv:
        for it in items:
            where = f"src/{it.rel}:{it.line}"
            owner = f"{it.impl_of}::" if it.impl_of and it.impl_of != "<trait>" else ""
            verdict = f"KEEP  ({it.keep})" if it.keep else "CRATE"
            print(f"{where:40s} {it.kind:6s} {owner}{it.name:30s} {verdict}")
        print()
    print(f"pub items (fn|struct|enum|trait|type|const|static|union|mod): {len(items)}")
    print(f"  keep pub: {len(keep)}")
    reasons = {}
    for x in keep:
        r = re.sub(r" \(.*\)$", "", x.keep) if x.keep.startswith("holds") else x.keep
        r = re.sub(r" \(method of kept .*\)", " (method of a kept type)", r)
        r = re.sub(r"^method of \w+, re-exported", "method of a type re-exported", r)
        r = "tests only (KEEP_ANYWAY)" if r.startswith("tests only") else r
        reasons[r] = reasons.get(r, 0) + 1
    for r, n in sorted(reasons.items(), key=lambda t: -t[1]):
        print(f"    {n:5d}  {r}")
    print(f"  candidates for pub(crate): {len(cand)} "
          f"({sum(1 for x in cand if x.kind == 'mod')} of them modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
