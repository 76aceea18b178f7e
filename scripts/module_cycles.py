#!/usr/bin/env python3
"""Lists the imports between the files of each folder of src/ and the cycles among them.

    python3 scripts/module_cycles.py          # cycles only (exit 1 if any)
    python3 scripts/module_cycles.py --all    # every sibling import, then the cycles

A file `src/F/a.rs` imports its sibling `b` when it names `super::b` (in a `use` or a path) or
`crate::F::b`; `#[cfg(test)]` modules are left out (a test may borrow a sibling's fixtures).
Standard library only.
"""
import pathlib
import re
import sys

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"


def strip_tests(text: str) -> str:
    """The file without its `#[cfg(test)] mod … { … }` blocks and without comments."""
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def sibling_imports(folder: pathlib.Path) -> dict:
    files = {p.stem: p for p in folder.glob("*.rs") if p.stem != "mod"}
    graph = {}
    for name, path in files.items():
        body = strip_tests(path.read_text())
        rel = folder.relative_to(SRC).as_posix().replace("/", "::")
        found = set(re.findall(r"\bsuper::(\w+)", body))
        found |= set(re.findall(rf"\bcrate::{re.escape(rel)}::(\w+)", body))
        # `use super::{a, b::X}` groups
        for grp in re.findall(r"\bsuper::\{([^}]*)\}", body):
            found |= set(re.findall(r"(?:^|,)\s*(\w+)", grp))
        graph[name] = sorted(n for n in found if n in files and n != name)
    return graph


def cycles(graph: dict) -> list:
    """Pairs and longer loops, each once (Tarjan's strongly connected components)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def main() -> int:
    show_all = "--all" in sys.argv[1:]
    found = 0
    for folder in sorted(p for p in SRC.rglob("*") if p.is_dir()):
        graph = sibling_imports(folder)
        rel = folder.relative_to(SRC).as_posix()
        if show_all:
            for name, deps in sorted(graph.items()):
                if deps:
                    print(f"src/{rel}/{name}.rs -> {', '.join(deps)}")
        for comp in cycles(graph):
            found += 1
            print(f"cycle in src/{rel}/: {' <-> '.join(c + '.rs' for c in comp)}")
    print(f"{found} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
