#!/usr/bin/env python3
"""The module map and the file-level import graph of src/, its cycles, the longest functions and
the `pub` count.

    python3 scripts/code_map.py              # everything (exit 1 if the graph has a cycle)
    python3 scripts/code_map.py --summary    # the counts only
    python3 scripts/code_map.py --graph      # the import edges (and the cycles)
    python3 scripts/code_map.py --no-fail    # exit 0 even with cycles (combines with the above)
    python3 scripts/code_map.py --self-test  # check the resolver on a small fake src/ tree
    python3 scripts/code_map.py --src DIR    # another crate's src/ (default: this repository's)

Sections of the full output: the module map (every file as its module path, with its line count,
by folder); the import graph (for each file the other files of the crate it imports); the cycles
(Tarjan's strongly connected components with more than one file); the longest functions; the
`pub` items.

How an import is resolved. Every `use` tree (`crate::`, `super::`, `self::`, a child module's
name, groups `{a::X, b::{c, d}}`, `self`, `as`, globs) and every path written in the code
(`crate::kernel::linalg::gemm_abt(..)`, `super::x::y`, `child::f(..)`) is followed to the file
that DEFINES the item: re-exports (`pub use`, `pub(crate) use` and private `use`, which children
see) in `mod.rs`/`lib.rs` are followed, a glob re-export (`pub use types::*`) through the items the
glob's source defines. A name reached through a re-export also counts as importing the file that
re-exports it (a `pub use` edge: `use crate::api::Trained` imports `api/trained.rs`, which defines
it, and `api/mod.rs`, whose `pub use trained::Trained` it goes through), so a facade that
re-exports a module which uses the facade is a cycle. A path that names a module counts as importing that module's file; items
defined in a `mod.rs` count as that `mod.rs`. A glob import in the importing file (`use
super::types::*`) counts the names of the glob's source that the file mentions. `#[cfg(test)]`
modules (inline or a file such as `plot/tests.rs`), other `#[cfg(test)]` items and statements,
comments and string contents are left out. An
import by a file of its own folder's `mod.rs` (of `lib.rs` for the files directly in src/) is not
an edge (a child may use what its parent gathers); an item the `mod.rs` merely re-exports still
counts as an import of the file defining it. `src/main.rs` is the binary: its `pathkernel::`
paths are resolved like `crate::` ones.

Functions: every `fn` with a body outside `#[cfg(test)]` modules, its length being the lines from
the `fn` keyword to the closing brace, both included. `pub` items: lines that start (after the
indentation) with `pub fn|struct|enum|trait|type|const|static|mod|use|union` (`pub const fn`,
`pub unsafe fn`, `pub async fn` count as `fn`), not `pub(crate)`, `pub(super)`, `pub(in ..)`, not
struct fields, outside `#[cfg(test)]` modules; methods in `impl` blocks count.

Standard library only; deterministic output.
"""
import pathlib
import re
import sys
import tempfile

SRC = pathlib.Path(__file__).resolve().parent.parent / "src"
CRATE = "pathkernel"  # the library's name, as the binary (src/main.rs) writes it
LONG_FN = 150
TOP_FNS = 15

IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
EXTERNAL = ("external",)


# ------------------------------------------------------------------------------------------------
# Lexing: comments and literals blanked (same length, newlines kept), then the test modules.


def blank(text: str) -> str:
    """`text` with comments and the contents of string/char literals replaced by spaces; line
    breaks are kept, so offsets and line numbers stay those of the file. A `'` starts a char
    literal only when it closes as one (`'x'`, `'\\n'`, `'\\u{..}'`); `'a` is a lifetime."""
    out = list(text)
    n = len(text)

    def wipe(a, b):
        for k in range(a, min(b, n)):
            if out[k] != "\n":
                out[k] = " "

    i = 0
    while i < n:
        c = text[i]
        if c == "/" and text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
            i = j
        elif c == "/" and text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            wipe(i, j)
            i = j
        elif c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            m = re.compile(r"(?:br|rb|r)(#*)\"").match(text, i)
            if m:  # raw string r"..", r#".."#, br".."
                end = text.find('"' + m.group(1), m.end())
                end = n if end < 0 else end + 1 + len(m.group(1))
                wipe(i, end)
                i = end
            elif text.startswith('b"', i) or text.startswith("b'", i):
                i += 1  # the literal itself is handled at the quote
            else:
                i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, j + 1)
            i = j + 1
        elif c == "'":
            m = re.compile(r"'(?:\\u\{[0-9A-Fa-f_]*\}|\\x[0-9A-Fa-f]{2}|\\.|[^\\'\n])'").match(text, i)
            if m:
                wipe(i, m.end())
                i = m.end()
            else:  # a lifetime or a label
                i += 1
        else:
            i += 1
    return "".join(out)


TEST_ATTR = re.compile(r"#\[cfg\(test\)\]")
TEST_MOD = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+(" + IDENT + r")\s*([{;])")


def match_brace(text: str, open_at: int) -> int:
    """Offset just past the `}` closing the `{` at `open_at` (in blanked text)."""
    depth, j = 0, open_at
    while j < len(text):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


def find_outside_parens(text: str, j: int, stops: str) -> int:
    """The index of the first character of `stops` from `j` on that is outside parentheses and
    brackets (`len(text)` if none)."""
    depth = 0
    while j < len(text):
        c = text[j]
        if c in "([":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif depth == 0 and c in stops:
            return j
        j += 1
    return j


def strip_tests(blanked: str):
    """(the blanked text with its `#[cfg(test)] mod x { .. }` blocks blanked too, the names of
    the `#[cfg(test)] mod x;` files it declares)."""
    out = list(blanked)
    test_files = set()
    pos = 0
    while True:
        m = TEST_MOD.search(blanked, pos)
        if not m:
            break
        if m.group(2) == ";":
            test_files.add(m.group(1))
            end = m.end()
        else:
            end = match_brace(blanked, m.end() - 1)
        for k in range(m.start(), end):
            if out[k] != "\n":
                out[k] = " "
        pos = end
    # Any other `#[cfg(test)]` item or statement (`#[cfg(test)] let _g = crate::x::f();`, a
    # test-only `impl` or `fn`, a field): blanked up to its `;` or `,`, or through its braces.
    text = "".join(out)
    for m in list(TEST_ATTR.finditer(text)):
        if text[m.start()] == " ":
            continue  # inside a test module blanked above
        j = find_outside_parens(text, m.end(), ";,{}")
        if j < len(text) and text[j] in ";,":
            j += 1
        elif j < len(text) and text[j] == "{":
            j = match_brace(text, j)
        for k in range(m.start(), j):
            if out[k] != "\n":
                out[k] = " "
    return "".join(out), test_files


# ------------------------------------------------------------------------------------------------
# Modules: the files reached from lib.rs (and main.rs) by `mod x;`, and the inline `mod x { }`.


class Module:
    def __init__(self, path, file, inline=False):
        self.path = path          # tuple of names; () is the crate root
        self.file = file          # the file (src-relative posix path) holding it
        self.inline = inline
        self.children = {}        # name -> module path
        self.defs = set()         # items defined here (fn, struct, ..., macro_rules)
        self.bindings = {}        # name -> list of path segments (module-level `use`)
        self.globs = []           # path segments of module-level `use p::*`


class SourceFile:
    def __init__(self, rel, text):
        self.rel = rel
        self.text = text
        self.lines = text.count("\n") + (0 if text.endswith("\n") or not text else 1)
        self.code, self.test_files = strip_tests(blank(text))
        self.module = None        # its (file) module path
        self.uses = []            # (start, context module path, [(segs, name, glob)], end)
        self.scopes = []          # (start, end, inline module path)


ITEM = re.compile(
    r"[{};]"
    r"|\b(?:struct|enum|union|trait|type|const|static|fn)\s+(" + IDENT + r")"
    r"|\bmacro_rules!\s*(" + IDENT + r")"
    r"|\bmod\s+(" + IDENT + r")\s*([{;])"
    r"|\buse\b"
)
TOKEN = re.compile(r"\s*(::|[{},*;]|" + IDENT + r")")


def parse_use_tree(src: str):
    """`a::b::{c, d::e as f, g::*, self}` -> [(segments, bound name or None, is_glob)]."""
    toks = TOKEN.findall(src)
    toks = [t for t in toks if t != ";"]
    pos = [0]

    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None

    def take():
        t = peek()
        pos[0] += 1
        return t

    def tree(prefix):
        out = []
        segs = list(prefix)
        if peek() == "::":  # leading `::`
            take()
        while True:
            t = peek()
            if t == "{":
                take()
                while peek() not in ("}", None):
                    out += tree(segs)
                    if peek() == ",":
                        take()
                take()
                return out
            if t == "*":
                take()
                return [(segs, None, True)]
            if t is None or t in (",", "}"):
                return out
            take()
            if t == "self" and len(segs) == len(prefix) and prefix:
                name = prefix[-1]  # `{self}`: the module itself
            else:
                segs.append(t)
                name = t
            if peek() == "::":
                take()
                continue
            if peek() == "as":
                take()
                name = take()
                name = None if name == "_" else name
            return [(segs, name, False)]

    return tree([])


def parse_file(sf: SourceFile, mods: dict, modpath: tuple):
    """Fills the modules of one file: items, module-level `use`s, `mod x;` children and inline
    modules; collects every `use` of the file (with its context) for the graph."""
    code = sf.code
    stack = []  # ('mod', path, start) | ('other',)
    i = 0
    while True:
        m = ITEM.search(code, i)
        if not m:
            break
        tok = m.group(0)
        ctx = next((s[1] for s in reversed(stack) if s[0] == "mod"), modpath)
        module_level = all(s[0] == "mod" for s in stack)
        if tok == "{":
            stack.append(("other",))
            i = m.end()
        elif tok == "}":
            if stack:
                s = stack.pop()
                if s[0] == "mod":
                    sf.scopes.append((s[2], m.end(), s[1]))
            i = m.end()
        elif tok == ";":
            i = m.end()
        elif m.group(3):  # mod x; / mod x {
            name = m.group(3)
            if module_level:
                child = ctx + (name,)
                mods[ctx].children[name] = child
                if m.group(4) == "{":
                    mods[child] = Module(child, sf.rel, inline=True)
            if m.group(4) == "{":
                stack.append(("mod", ctx + (name,), m.start()) if module_level else ("other",))
            i = m.end()
        elif tok == "use":
            end = code.find(";", m.end())
            end = len(code) if end < 0 else end
            leaves = parse_use_tree(code[m.end():end])
            sf.uses.append((m.start(), ctx, leaves, end + 1))
            if module_level:
                mod = mods[ctx]
                for segs, name, glob in leaves:
                    if glob:
                        mod.globs.append(segs)
                    elif name:
                        mod.bindings[name] = segs
            i = end + 1
        else:
            name = m.group(1) or m.group(2)
            if module_level:
                mods[ctx].defs.add(name)
            i = m.end()


# ------------------------------------------------------------------------------------------------
# The crate: files, modules and the resolver.


class Crate:
    def __init__(self, src: pathlib.Path):
        self.src = src
        self.files = {}     # rel -> SourceFile (only the files compiled outside tests)
        self.mods = {}      # module path -> Module
        self.unresolved = set()  # (file, path text): names not found, counted as the module's file
        self.orphans = []
        self.test_only = []
        self._load()

    def _file_for(self, folder: pathlib.Path, name: str):
        for cand in (folder / f"{name}.rs", folder / name / "mod.rs"):
            if cand.exists():
                return cand
        return None

    def _load_file(self, path: pathlib.Path, modpath: tuple):
        rel = path.relative_to(self.src).as_posix()
        sf = SourceFile(rel, path.read_text(encoding="utf-8"))
        sf.module = modpath
        self.files[rel] = sf
        self.mods[modpath] = Module(modpath, rel)
        parse_file(sf, self.mods, modpath)
        # the folder a file's `mod x;` children live in
        if path.name in ("mod.rs", "lib.rs", "main.rs"):
            folder = path.parent
        else:
            folder = path.parent / path.stem
        for name in sorted(sf.test_files):
            p = self._file_for(folder, name)
            if p:
                self.test_only.append(p.relative_to(self.src).as_posix())
        for mp, mod in list(self.mods.items()):
            if mod.file != rel:
                continue
            for name, child in sorted(mod.children.items()):
                if child in self.mods:
                    continue  # inline
                # a `mod x;` inside an inline module lives in a subfolder named after it
                sub = folder.joinpath(*mp[len(modpath):])
                p = self._file_for(sub, name)
                if p is not None:
                    self._load_file(p, child)

    def _load(self):
        lib = self.src / "lib.rs"
        if lib.exists():
            self._load_file(lib, ())
        main = self.src / "main.rs"
        if main.exists():
            self._load_file(main, ("<bin>",))
        seen = set(self.files) | set(self.test_only)
        for p in sorted(self.src.rglob("*.rs")):
            rel = p.relative_to(self.src).as_posix()
            if rel not in seen:
                self.orphans.append(rel)

    # -- resolution --------------------------------------------------------------------------

    def parent(self, mp):
        return mp[:-1] if mp and mp != ("<bin>",) else mp

    def root_of(self, mp):
        return ("<bin>",) if mp[:1] == ("<bin>",) else ()

    def lookup(self, mp, name, visiting, via=None):
        """What `name` means in module `mp`: ('mod', path) | ('item', file) | EXTERNAL (a `use`
        of another crate's item) | None (not found). When the name is found through a `use` of
        `mp` (a re-export: `pub use x::Y`, `pub use x::*`) and `via` is a list, the file holding
        that `use` is appended to it, then the files of the re-exports further down the chain."""
        mod = self.mods.get(mp)
        if mod is None:
            return None
        if name in mod.children and mod.children[name] in self.mods:
            return ("mod", mod.children[name])
        if name in mod.defs:
            return ("item", mod.file)
        if name in mod.bindings:
            key = (mp, name)
            if key in visiting:
                return EXTERNAL
            sub = []
            t = self.resolve(mod.bindings[name], mp, visiting | {key}, via=sub)
            if t is None:
                return EXTERNAL
            if via is not None:
                via += [mod.file] + sub
            return t
        for g in mod.globs:
            key = (mp, "*", tuple(g))
            if key in visiting:
                continue
            sub = []
            src = self.resolve(g, mp, visiting | {key}, via=sub)
            if src and src[0] == "mod":
                t = self.lookup(src[1], name, visiting | {key}, via=sub)
                if t is not None and t is not EXTERNAL:
                    if via is not None:
                        via += [mod.file] + sub
                    return t
        return None

    def resolve(self, segs, ctx, visiting=frozenset(), note=None, via=None):
        """The target of a path written in module `ctx`; None for another crate's path. `via`
        (a list) receives the files of the re-exports the path went through (see `lookup`)."""
        if not segs:
            return None
        first, rest = segs[0], list(segs[1:])
        if first == "crate":
            cur = self.root_of(ctx)
        elif first == CRATE and ctx[:1] == ("<bin>",):
            cur = ()
        elif first == "self":
            cur = ctx
        elif first == "super":
            cur = self.parent(ctx)
        else:
            t = self.lookup(ctx, first, visiting, via)
            if t is None or t is EXTERNAL:
                return None
            if t[0] == "item":
                return t
            cur = t[1]
        for k, seg in enumerate(rest):
            if seg == "super":
                cur = self.parent(cur)
                continue
            if seg == "self":
                continue
            t = self.lookup(cur, seg, visiting, via)
            if t is EXTERNAL:
                return None
            if t is None:
                if note is not None:
                    note.add((self.mods[cur].file, "::".join(segs[: k + 2])))
                return ("item", self.mods[cur].file)
            if t[0] == "item":
                return t
            cur = t[1]
        return ("mod", cur)

    def target_file(self, t):
        return t[1] if t[0] == "item" else self.mods[t[1]].file

    def names_of(self, mp, visiting=frozenset()):
        """Every name module `mp` offers (for a glob import of it)."""
        mod = self.mods.get(mp)
        if mod is None or mp in visiting:
            return set()
        names = set(mod.children) | mod.defs | set(mod.bindings)
        for g in mod.globs:
            src = self.resolve(g, mp)
            if src and src[0] == "mod":
                names |= self.names_of(src[1], visiting | {mp})
        return names

    def context_at(self, sf, offset):
        best = sf.module
        best_len = -1
        for a, b, mp in sf.scopes:
            if a <= offset < b and b - a > 0 and (best_len < 0 or b - a < best_len):
                best, best_len = mp, b - a
        return best

    # -- the graph ---------------------------------------------------------------------------

    def imports(self, sf):
        """{target file: [how, ...]} for one file, self-imports dropped."""
        found = {}
        code = sf.code

        def add(t, how, via=()):
            if t is None:
                return
            f = self.target_file(t)
            if f != sf.rel:
                found.setdefault(f, set()).add(how)
            for r in via:  # the re-exporting files the name went through
                if r != sf.rel and r != f:
                    found.setdefault(r, set()).add(how + " (re-exported)")

        # the file without its `use` statements, for the paths and names written in the code
        body = list(code)
        for start, _ctx, _leaves, end in sf.uses:
            for k in range(start, min(end, len(body))):
                if body[k] != "\n":
                    body[k] = " "
        body = "".join(body)
        body = re.sub(r"\bpub\s*\(\s*in\b[^)]*\)", lambda m: " " * len(m.group(0)), body)
        words = set(re.findall(IDENT, body))

        for _start, ctx, leaves, _end in sf.uses:
            for segs, _name, glob in leaves:
                via = []
                t = self.resolve(segs, ctx, note=self.unresolved, via=via)
                if not glob:
                    add(t, "use " + "::".join(segs), via)
                elif t and t[0] == "mod":
                    add(t, "use " + "::".join(segs) + "::*", via)
                    for name in sorted(self.names_of(t[1]) & words):
                        via2 = list(via)
                        u = self.lookup(t[1], name, frozenset(), via2)
                        add(None if u is EXTERNAL else u, "use " + "::".join(segs) + "::* (" + name + ")", via2)
                else:
                    add(t, "use " + "::".join(segs) + "::*", via)

        for m in re.finditer(r"(?<![\w:.$])(" + IDENT + r")((?:\s*::\s*" + IDENT + r")+)", body):
            first = m.group(1)
            segs = [first] + re.findall(IDENT, m.group(2))
            ctx = self.context_at(sf, m.start())
            via = []
            t = self.resolve(segs, ctx, note=self.unresolved, via=via)
            add(t, "path " + "::".join(segs), via)
        return found

    def graph(self):
        edges, ignored = {}, {}
        for rel, sf in sorted(self.files.items()):
            own_parent = None
            if sf.module and sf.module != ("<bin>",):
                p = self.mods.get(self.parent(sf.module)) if sf.module else None
                if p is not None and p.path != sf.module:
                    own_parent = p.file
            deps = self.imports(sf)
            edges[rel] = {}
            for f, how in deps.items():
                if f == own_parent:
                    ignored.setdefault(rel, {})[f] = how
                else:
                    edges[rel][f] = how
        return edges, ignored


# ------------------------------------------------------------------------------------------------
# Cycles, functions, pub items.


def tarjan(graph: dict) -> list:
    """The strongly connected components with more than one node, each sorted, in order."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def a_cycle(graph, comp):
    """One closed walk through a component, shortest from its first file back to itself, e.g.
    [a, b, a] -- an illustration; the component lists every file in it."""
    start = comp[0]
    members = set(comp)
    prev = {start: None}
    queue = [start]
    for v in queue:
        for w in sorted(graph[v]):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


FN = re.compile(r"\bfn\s+(" + IDENT + r")")


def functions(crate: Crate):
    """[(lines, file, line, name)] for every fn with a body outside test modules."""
    out = []
    for rel, sf in sorted(crate.files.items()):
        code = sf.code
        for m in FN.finditer(code):
            j = find_outside_parens(code, m.end(), "{;")
            if j >= len(code) or code[j] == ";":
                continue
            end = match_brace(code, j)
            first = code.count("\n", 0, m.start()) + 1
            last = code.count("\n", 0, end - 1) + 1
            out.append((last - first + 1, rel, first, m.group(1)))
    return sorted(out, key=lambda r: (-r[0], r[1], r[2]))


PUB = re.compile(
    r"^[ \t]*pub[ \t]+(?:(?:const|async|unsafe|default|extern(?:[ \t]+\"?[A-Za-z]*\"?)?)[ \t]+)*"
    r"(fn|struct|enum|trait|type|const|static|mod|use|union)\b",
    re.M,
)
PUB_ANY = re.compile(r"^[ \t]*pub\b", re.M)


def pub_items(crate: Crate):
    """[(file, line, kind)] per the definition above."""
    out = []
    for rel, sf in sorted(crate.files.items()):
        for m in PUB.finditer(sf.code):
            kind = m.group(1)
            if kind == "const" and re.match(r"\s*fn\b", sf.code[m.end():]):
                kind = "fn"
            out.append((rel, sf.code.count("\n", 0, m.start()) + 1, kind))
    return out


def top_folder(rel):
    return rel.split("/")[0] + "/" if "/" in rel else "(src/*.rs)"


# ------------------------------------------------------------------------------------------------
# Report.


def modname(crate, rel):
    mp = crate.files[rel].module
    if mp == ():
        return "crate"
    if mp == ("<bin>",):
        return "(binary)"
    return "::".join(mp)


def report(crate: Crate, mode: str) -> int:
    edges, ignored = crate.graph()
    graph = {f: set(d) for f, d in edges.items()}
    comps = tarjan(graph)
    fns = functions(crate)
    pubs = pub_items(crate)
    n_edges = sum(len(d) for d in edges.values())
    n_ignored = sum(len(d) for d in ignored.values())
    long_fns = [f for f in fns if f[0] > LONG_FN]
    total_lines = sum(sf.lines for sf in crate.files.values())
    p = print

    def summary():
        p("== summary")
        p(f"files                       {len(crate.files)} ({total_lines} lines)")
        p(f"import edges                {n_edges} (file -> file; besides, {n_ignored} child -> own mod.rs/lib.rs, not counted)")
        p(f"files in cycles             {sum(len(c) for c in comps)}")
        p(f"cycles (SCCs > 1 file)      {len(comps)}")
        p(f"functions > {LONG_FN} lines       {len(long_fns)} (of {len(fns)} fns with a body)")
        p(f"pub items                   {len(pubs)} ({sum(1 for x in pubs if x[2] not in ('mod', 'use'))} without pub mod / pub use)")

    if mode == "summary":
        summary()
        return 1 if comps else 0

    if mode == "all":
        p("== module map (src/, test-only files left out)")
        by_folder = {}
        for rel in crate.files:
            folder = rel.rsplit("/", 1)[0] + "/" if "/" in rel else ""
            by_folder.setdefault(folder, []).append(rel)
        for folder in sorted(by_folder):
            rels = sorted(by_folder[folder])
            lines = sum(crate.files[r].lines for r in rels)
            p(f"src/{folder}  ({len(rels)} files, {lines} lines)")
            for rel in rels:
                p(f"  {crate.files[rel].lines:6d}  {modname(crate, rel):32s} src/{rel}")
        if crate.test_only:
            p("test-only files (#[cfg(test)] mod x;): " + ", ".join("src/" + r for r in sorted(crate.test_only)))
        if crate.orphans:
            p("not reached by any `mod` declaration: " + ", ".join("src/" + r for r in crate.orphans))
        p()

    p("== import graph (file -> the other files of the crate it imports)")
    for rel in sorted(edges):
        deps = sorted(edges[rel])
        p(f"src/{rel} ({len(deps)}) -> {', '.join(deps) if deps else '-'}")
    p()
    if mode == "all":
        p("== imported by (file <- the files importing it)")
        rev = {}
        for a, deps in edges.items():
            for b in deps:
                rev.setdefault(b, set()).add(a)
        for rel in sorted(edges):
            users = sorted(rev.get(rel, ()))
            p(f"src/{rel} ({len(users)}) <- {', '.join(users) if users else '-'}")
        p()

    p(f"== cycles: {len(comps)}")
    for comp in comps:
        p(f"cycle of {len(comp)} files: {', '.join(comp)}")
        walk = a_cycle(graph, comp)
        p(f"  e.g. {' -> '.join(walk)}")
        for a in comp:
            for b in sorted(graph[a] & set(comp)):
                hows = sorted(edges[a][b], key=lambda h: (not h.startswith("use"), h))
                more = f" (+{len(hows) - 3} more)" if len(hows) > 3 else ""
                p(f"  {a} -> {b}: {'; '.join(hows[:3])}{more}")
    p()

    if mode == "all":
        p(f"== longest functions (lines from `fn` to its closing brace; {len(fns)} fns with a body)")
        for lines, rel, line, name in fns[:TOP_FNS]:
            p(f"  {lines:5d}  src/{rel}:{line}  {name}")
        p(f"functions over {LONG_FN} lines: {len(long_fns)}")
        p()

        p(f"== pub items: {len(pubs)}")
        kinds = ["fn", "struct", "enum", "trait", "type", "const", "static", "mod", "use", "union"]
        count = {k: sum(1 for x in pubs if x[2] == k) for k in kinds}
        p("by kind:   " + "  ".join(f"{k} {count[k]}" for k in kinds if count[k] or k != "union"))
        no_mod_use = len(pubs) - count["mod"] - count["use"]
        p(f"without pub mod / pub use: {no_mod_use}; "
          f"fn+struct+enum+trait+type+const only: {sum(count[k] for k in ['fn', 'struct', 'enum', 'trait', 'type', 'const'])}")
        folders = sorted({top_folder(r) for r in crate.files})
        p("by top-level folder (total; without pub mod / pub use):")
        for folder in folders:
            xs = [x for x in pubs if top_folder(x[0]) == folder]
            p(f"  {folder:16s} {len(xs):5d} {sum(1 for x in xs if x[2] not in ('mod', 'use')):5d}")
        naive = sum(len(PUB_ANY.findall(sf.code)) for sf in crate.files.values())
        p(f"for comparison: every line starting with `pub` (fields, pub(crate) .. included), tests out: {naive}")
        # what `grep -rE '^\s*pub (fn|struct|..)\b' src` counts: test modules and test files in
        texts = [sf.text for sf in crate.files.values()]
        texts += [(crate.src / rel).read_text(encoding="utf-8") for rel in crate.test_only]
        raw = [m.group(1) for t in texts for m in PUB.finditer(blank(t))]
        p(f"as a plain grep over src/ counts them (test modules in): {len(raw)}; "
          f"without pub mod / pub use: {sum(1 for k in raw if k not in ('mod', 'use'))}")
        p()

        if crate.unresolved:
            p("== names not found in the module a path names (counted as that module's file)")
            for f, path in sorted(crate.unresolved):
                p(f"  src/{f}: {path}")
            p()

    summary()
    return 1 if comps else 0


# ------------------------------------------------------------------------------------------------
# Self-test.

FAKE = {
    "lib.rs": "pub mod k;\npub mod m;\npub mod top;\npub mod user;\npub use top::Top;\n",
    "top.rs": "pub struct Top;\n",
    "k/mod.rs": (
        "mod driver;\nmod stateful;\nmod types;\npub mod lin;\n"
        "pub use driver::{compute, Options};\npub use types::*;\npub(crate) use stateful::State;\n"
        "pub fn facade_own() {}\n"
    ),
    "k/driver.rs": (
        "use super::types::*;\nuse crate::k::State; // via the facade: stateful.rs\n"
        "pub fn compute() -> Kind { let _ = \"crate::m::Model\"; todo!() }\npub struct Options;\n"
    ),
    "k/stateful.rs": (
        "use crate::k::{compute, facade_own};\n"
        "pub struct State<'a>(&'a u8);\nfn helper() -> char { let c = '{'; c }\n"
        "#[cfg(test)]\nmod tests {\n    use crate::m::Model;\n}\n"
    ),
    "k/types.rs": "pub enum Kind { A }\npub struct Side;\n",
    "k/lin.rs": "pub fn gemm() {\n    #[cfg(test)]\n    let _g = crate::top::Top;\n}\n#[cfg(test)]\nimpl crate::top::Top { fn t() {} }\n",
    "user.rs": "use crate::m::{T, Kind};\npub fn g() { crate::m::k::lin::gemm(); }\n",
    "m/mod.rs": (
        "pub struct Model;\n"
        "pub fn f() { crate::k::lin::gemm(); let _s: crate::k::Side; }\n"
        "pub use crate::{top::Top as T, k::{self, Kind}};\n"
    ),
}


def self_test() -> int:
    with tempfile.TemporaryDirectory() as d:
        src = pathlib.Path(d) / "src"
        for rel, text in FAKE.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        crate = Crate(src)
        edges, ignored = crate.graph()
        got = {f: sorted(d) for f, d in edges.items()}
        want = {
            "lib.rs": ["top.rs"],
            "top.rs": [],
            "k/mod.rs": ["k/driver.rs", "k/stateful.rs", "k/types.rs"],
            "k/driver.rs": ["k/stateful.rs", "k/types.rs"],   # Kind by the glob, State by the facade
            "k/stateful.rs": ["k/driver.rs"],                  # compute by the facade; the test module out
            "k/types.rs": [],
            "k/lin.rs": [],
            "m/mod.rs": ["k/lin.rs", "k/mod.rs", "k/types.rs", "top.rs"],  # inline paths, `self` in a group
            # through m/mod.rs's re-exports (and k/mod.rs's glob for Kind): the facades count
            "user.rs": ["k/lin.rs", "k/mod.rs", "k/types.rs", "m/mod.rs", "top.rs"],
        }
        ok = True
        for f in sorted(set(want) | set(got)):
            if got.get(f) != want.get(f):
                print(f"self-test: {f}: got {got.get(f)}, want {want.get(f)}")
                ok = False
        if sorted(ignored.get("k/stateful.rs", {})) != ["k/mod.rs"]:
            print(f"self-test: stateful.rs -> its own mod.rs (facade_own) should be set aside: {ignored}")
            ok = False
        comps = tarjan({f: set(d) for f, d in edges.items()})
        if comps != [["k/driver.rs", "k/stateful.rs"]]:
            print(f"self-test: cycles {comps}, want [['k/driver.rs', 'k/stateful.rs']]")
            ok = False
        fns = {(r[1], r[3]): r[0] for r in functions(crate)}
        if fns.get(("k/stateful.rs", "helper")) != 1 or ("k/stateful.rs", "tests") in fns:
            print(f"self-test: functions {fns}")
            ok = False
        pubs = pub_items(crate)
        if len(pubs) != 20:
            print(f"self-test: {len(pubs)} pub items, want 20: {pubs}")
            ok = False
    print("self-test: ok" if ok else "self-test: FAILED")
    return 0 if ok else 1


def main(argv) -> int:
    args = list(argv)
    if "--self-test" in args:
        return self_test()
    src = SRC
    if "--src" in args:
        src = pathlib.Path(args[args.index("--src") + 1])
    mode = "summary" if "--summary" in args else "graph" if "--graph" in args else "all"
    status = report(Crate(src), mode)
    return 0 if "--no-fail" in args else status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
