#!/usr/bin/env python3
"""The guide's module map (docs/src/modules.md) against src/: every file of src/ is in it, and
every file it names exists.

Each `## ...` section of the map names its folders in backticks (`src/gp/`; "The top level" is
src/ itself). A file of src/ belongs to the section whose folder is its longest prefix and must
be named in that section's text, by its path below that folder or by its file name (the map
draws nested folders as an indented tree). Unit-test files (`tests.rs`) need not be named: the
map's introduction says where they are. Conversely each `NAME.rs` the section names must exist
below one of the section's folders (or be a path from src/ or the repository's root). Exits 1 with one line per difference.

    python3 scripts/check_module_map.py [docs/src/modules.md]
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def sections(text):
    """(folders, text) per `## ` section; folders relative to the repository root."""
    out = []
    for chunk in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = chunk.partition("\n")
        folders = [f.rstrip("/") for f in re.findall(r"`(src/[\w/]*)`", title)]
        if title.strip().lower().startswith("the top level"):
            folders = ["src"]
        if folders:
            out.append((folders, body))
    return out


def main():
    path = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "src" / "modules.md"
    secs = sections(path.read_text())
    bad = []
    files = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "src").rglob("*.rs"))
    for f in files:
        if f.endswith("/tests.rs"):
            continue
        best = None
        for folders, body in secs:
            for d in folders:
                if f.startswith(d + "/") and (best is None or len(d) > len(best[0])):
                    best = (d, body)
        if best is None:
            bad.append(f"{f}: no section of the map holds its folder")
            continue
        d, body = best
        rel = f[len(d) + 1:]
        name = f.rsplit("/", 1)[1]
        if not re.search(r"(?<![\w/])" + re.escape(rel) + r"(?!\w)", body) and not re.search(r"(?<![\w.])" + re.escape(name) + r"(?!\w)", body):
            bad.append(f"{f}: not in the map's section for {d}/")
    for folders, body in secs:
        # Files named in the section's text that do not exist under its folders (or their
        # subfolders, as the tree draws them).
        for named in sorted(set(re.findall(r"(?<![\w.])([\w/]+\.rs)\b", body))):
            if (ROOT / named).is_file() or (ROOT / "src" / named).is_file():
                ok = True  # a path from the repository's root or from src/
            else:
                ok = any(p.as_posix().endswith("/" + named) for d in folders for p in (ROOT / d).rglob(named.rsplit("/", 1)[-1]))
            if not ok:
                bad.append(f"{path.name}: `{named}` (section of {', '.join(d + '/' for d in folders)}) is not a file of src/")
    for b in bad:
        print(b)
    print(f"{len(files)} files of src/ against {path.name}: {len(bad)} differences")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
