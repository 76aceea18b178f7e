#!/usr/bin/env python3
"""Compile kernels/epk.cu to PTX with NVRTC (no GPU needed) and check the result.

The device kernels of the node evaluation are written once (kernels/epk.cu) and compiled twice:
for the host by build.rs (the ordinary tests run them there) and here for a GPU. The PTX goes
into the GPU bundle (scripts/gpu/build.sh), where pathkernel's CUDA backend loads it.

Checks, each a one-line error and exit 1:
  - NVRTC compiles the source with `--fmad=false` (the host build's `-ffp-contract=off`);
  - the PTX is ISA 9.0 for sm_90 (a CUDA 13.0 driver, 580, JITs nothing newer: a newer NVRTC
    writes `.version 9.x` above it);
  - every kernel that src/device/kernels.rs declares is an entry of the PTX, with one parameter
    per declared argument after `n`, of the declared kind (`i` and buffers 64-bit integers, `f`
    a double), and no other entry.

Usage:
  python3 scripts/gpu/ptx.py [--out FILE] [--nvrtc LIBNVRTC]
NVRTC: --nvrtc, else $PATHKERNEL_NVRTC, else the `nvidia-cuda-nvrtc` 13.0 wheel in the venv
~/.cache/pathkernel-nvrtc (created with `pip install nvidia-cuda-nvrtc==13.0.88` when missing,
~6 s and 243 MB).
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "kernels", "epk.cu")
DECLS = os.path.join(ROOT, "src", "device", "kernels.rs")
VENV = os.path.expanduser("~/.cache/pathkernel-nvrtc")
WHEEL = "nvidia-cuda-nvrtc==13.0.88"
OPTIONS = [b"--gpu-architecture=compute_90", b"--fmad=false", b"--std=c++17"]
PTX_VERSION = "9.0"


def die(msg):
    print(f"ptx.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def find_nvrtc(given):
    if given:
        return given
    if os.environ.get("PATHKERNEL_NVRTC"):
        return os.environ["PATHKERNEL_NVRTC"]
    pattern = os.path.join(VENV, "lib", "python3*", "site-packages", "nvidia", "cu13", "lib", "libnvrtc.so.13")
    found = glob.glob(pattern)
    if not found:
        print(f"ptx.py: installing {WHEEL} into {VENV}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
        subprocess.run([os.path.join(VENV, "bin", "pip"), "install", "-q", WHEEL], check=True)
        found = glob.glob(pattern)
    if not found:
        die(f"no libnvrtc.so.13 under {VENV} after installing {WHEEL}")
    return found[0]


def declared():
    """(name, [kinds]) of every kernel in src/device/kernels.rs's `kernels!` list."""
    text = open(DECLS).read()
    body = text[text.index("kernels! {"):]
    out = []
    for m in re.finditer(r"^\s+(pk_\w+)\(n; (.*)\);\s*$", body, re.M):
        kinds = re.findall(r"\b\w+: ([ifrw])\b", m.group(2))
        out.append((m.group(1), kinds))
    if not out:
        die(f"no kernel declarations found in {DECLS}")
    return out


def compile_ptx(lib_path, src):
    # NVRTC dlopens libnvrtc-builtins.so.13.0 by name: loaded first from the same directory,
    # it is found without LD_LIBRARY_PATH.
    for b in glob.glob(os.path.join(os.path.dirname(lib_path), "libnvrtc-builtins.so.13.*")):
        ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(lib_path)
    major, minor = ctypes.c_int(), ctypes.c_int()
    nvrtc.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    prog = ctypes.c_void_p()
    rc = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), src, b"epk.cu", 0, None, None)
    if rc != 0:
        die(f"nvrtcCreateProgram returned {rc}")
    opts = (ctypes.c_char_p * len(OPTIONS))(*OPTIONS)
    rc = nvrtc.nvrtcCompileProgram(prog, len(OPTIONS), opts)
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    text = log.value.decode(errors="replace").strip()
    if rc != 0:
        die(f"NVRTC {major.value}.{minor.value} could not compile kernels/epk.cu: {text.splitlines()[0] if text else rc}\n{text}")
    if text:
        print(f"ptx.py: NVRTC says: {text}", file=sys.stderr)
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode(), f"{major.value}.{minor.value}"


def check(ptx, kernels):
    version = re.search(r"^\.version (\S+)", ptx, re.M)
    target = re.search(r"^\.target (\S+)", ptx, re.M)
    if not version or version.group(1) != PTX_VERSION:
        die(f"PTX ISA {version.group(1) if version else '?'}, expected {PTX_VERSION} (a CUDA 13.0 driver JITs nothing newer; use NVRTC 13.0.x)")
    if not target or target.group(1) != "sm_90":
        die(f"PTX target {target.group(1) if target else '?'}, expected sm_90")
    entries = {}
    for m in re.finditer(r"\.visible \.entry (\w+)\(\s*(.*?)\)", ptx, re.S):
        entries[m.group(1)] = re.findall(r"\.param \.(\w+) ", m.group(2))
    names = [k for k, _ in kernels]
    extra = sorted(set(entries) - set(names))
    if extra:
        die(f"PTX entries not declared in src/device/kernels.rs: {', '.join(extra)}")
    want_type = {"i": ("u64", "s64", "b64"), "r": ("u64", "b64"), "w": ("u64", "b64"), "f": ("f64",)}
    for name, kinds in kernels:
        if name not in entries:
            die(f"kernel {name} is declared but not in the PTX")
        params = entries[name]
        if len(params) != len(kinds) + 1:
            die(f"kernel {name}: {len(params)} parameters in the PTX, {len(kinds) + 1} declared")
        for j, (p, k) in enumerate(zip(params, ["i"] + kinds)):
            if p not in want_type[k]:
                die(f"kernel {name}: parameter {j} is .{p} in the PTX, declared `{k}`")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the PTX here")
    ap.add_argument("--nvrtc", help="path of libnvrtc.so.13")
    a = ap.parse_args()
    kernels = declared()
    ptx, version = compile_ptx(find_nvrtc(a.nvrtc), open(SOURCE, "rb").read())
    check(ptx, kernels)
    if a.out:
        tmp = a.out + ".partial"
        with open(tmp, "w") as f:
            f.write(ptx)
        os.replace(tmp, a.out)
    print(f"ptx.py: NVRTC {version}: {len(kernels)} kernels to PTX {PTX_VERSION} sm_90, {len(ptx)} bytes, parameters as declared" + (f", written to {a.out}" if a.out else ""))


if __name__ == "__main__":
    main()
