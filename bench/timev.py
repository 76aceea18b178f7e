"""A `/usr/bin/time -v` report, read (shared by the bench scripts, which run from the repository
root with `PYTHONPATH=bench`).

    from timev import read
    t = read("time.txt")   # t["wall_s"], t["user_s"], t["system_s"], t["cpu_percent"] ("185%"),
                           # t["minor_faults"], t["max_rss_kb"]
"""
import re


def read(path):
    """The fields of one report that the bench tables quote, as numbers (`cpu_percent` as printed)."""
    text = open(path).read()

    def field(label):
        m = re.search(re.escape(label) + r":\s*(.+)", text)
        if m is None:
            raise SystemExit(f"timev: {path}: no '{label}' (not a /usr/bin/time -v report?)")
        return m.group(1).strip()

    # h:mm:ss or m:ss.ss
    parts = [float(x) for x in field("Elapsed (wall clock) time (h:mm:ss or m:ss)").split(":")]
    return {
        "wall_s": sum(v * 60 ** i for i, v in enumerate(reversed(parts))),
        "user_s": float(field("User time (seconds)")),
        "system_s": float(field("System time (seconds)")),
        "cpu_percent": field("Percent of CPU this job got"),
        "minor_faults": int(field("Minor (reclaiming a frame) page faults")),
        "max_rss_kb": float(field("Maximum resident set size (kbytes)")),
    }
