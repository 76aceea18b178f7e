import os
import shutil

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))


def _binary():
    """The `pathkernel` binary: $PATHKERNEL_BIN, the checkout's release build (under
    $CARGO_TARGET_DIR or target/), or `pathkernel` on PATH."""
    cands = [os.environ.get("PATHKERNEL_BIN")]
    if os.environ.get("CARGO_TARGET_DIR"):
        cands.append(os.path.join(os.environ["CARGO_TARGET_DIR"], "release", "pathkernel"))
    cands += [os.path.join(REPO, "target", "release", "pathkernel"), shutil.which("pathkernel")]
    for c in cands:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


@pytest.fixture(scope="session")
def pathkernel():
    b = _binary()
    if b is None:
        pytest.skip("no pathkernel binary (set PATHKERNEL_BIN or build with cargo build --release)")
    return b
