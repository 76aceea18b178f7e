"""Writes golden.npz and golden_deflated.npz the way numpy's np.savez / np.savez_compressed do,
without numpy: CPython's zipfile with force_zip64=True (numpy's _savez) and .npy v1 headers built
as numpy's format.write_array_header_1_0 builds them (dict repr padded with spaces so that the
data start at a multiple of 64 bytes, ending in a newline). The Rust test
data::arrays::tests::golden_npz_from_python_zipfile reads them back.

    python3 tests/data/arrays/make_golden.py
"""
import os
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))


def npy(descr, shape, fmt, values):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    pad = 64 - (10 + len(header) + 1) % 64
    header = header + " " * (pad % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + struct.pack("<" + fmt * len(values), *values)


ARRAYS = {
    "x_train": npy("<f8", (4, 2), "d", [0.5, -1.0, 2.25, 3.0, -0.125, 8.0, 1e-3, 7.5]),
    "y_train": npy("<i8", (4,), "q", [0, 1, 2, 1]),
    "x_test": npy("<f4", (2, 2), "f", [1.5, -2.0, 0.25, 4.0]),
    "y_test": npy("|u1", (2,), "B", [2, 0]),
}

for name, compression in [("golden.npz", zipfile.ZIP_STORED), ("golden_deflated.npz", zipfile.ZIP_DEFLATED)]:
    with zipfile.ZipFile(os.path.join(HERE, name), mode="w", compression=compression, allowZip64=True) as zf:
        for key, data in ARRAYS.items():
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = compression
            with zf.open(info, "w", force_zip64=True) as f:
                f.write(data)
print("wrote golden.npz and golden_deflated.npz in", HERE)
