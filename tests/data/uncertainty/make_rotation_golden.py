#!/usr/bin/env python3
"""Golden values for the rotation of src/uncertainty/shift.rs, from scipy.

    python3 tests/data/uncertainty/make_rotation_golden.py > tests/data/uncertainty/rotation_golden.json

The image is img[r][c] = ((7 r + 13 c) % 17) / 16 (no randomness, so Rust rebuilds it). Each angle's
output is scipy.ndimage.rotate(img, angle, reshape=False, order=1, mode="grid-constant", cval=0):
bilinear, about the centre (13.5, 13.5), counter-clockwise as displayed, pixels outside counting
as 0. Made with numpy 2.4 and scipy 1.17.
"""
import json

import numpy as np
from scipy import ndimage

img = np.array([[((7 * r + 13 * c) % 17) / 16 for c in range(28)] for r in range(28)])
angles = [30.0, 45.0, -20.0, 137.0]
out = {
    "image": "img[r][c] = ((7 r + 13 c) % 17) / 16",
    "scipy": "ndimage.rotate(img, angle, reshape=False, order=1, mode='grid-constant', cval=0)",
    "rotations": {
        str(a): [float(v) for v in ndimage.rotate(img, a, reshape=False, order=1, mode="grid-constant", cval=0.0).ravel()]
        for a in angles
    },
}
print(json.dumps(out))
