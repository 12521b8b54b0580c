"""tools/fp8_convert: its float8_e4m3fn rounding (every finite code rounds
to itself, midpoints to the even code, nothing past 448), and the committed
tests/models/tiny_a_fp8 is exactly what it writes from tests/models/tiny_a
with 16x16 blocks."""
import filecmp
import importlib.util
import os

import numpy as np

from tools_cluster import REPO

_spec = importlib.util.spec_from_file_location(
    "fp8_convert", os.path.join(REPO, "tools", "fp8_convert", "fp8_convert.py"))
fp8 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fp8)


def test_every_finite_code_rounds_to_itself():
    codes = np.array([c for c in range(256) if c not in (0x7F, 0xFF)])
    vals = fp8._VALS[codes]
    got = fp8.to_e4m3(vals)
    # -0 (0x80) is zero: written as +0.
    same = (got == codes) | ((codes == 0x80) & (got == 0x00))
    assert same.all(), codes[~same]


def test_midpoints_round_to_the_even_code_and_the_top_saturates():
    pos = fp8._POS
    mids = (pos[:-1] + pos[1:]) / 2
    got = fp8.to_e4m3(mids)
    lo = np.arange(len(mids))
    want = np.where(lo % 2 == 0, lo, lo + 1)
    assert (got == want).all()
    assert fp8.to_e4m3(np.array([448.0, -448.0])).tolist() == [0x7E, 0xFE]


def test_committed_tiny_fp8_is_what_the_converter_writes(tmp_path):
    out = tmp_path / "tiny_a_fp8"
    fp8.convert(os.path.join(REPO, "tests", "models", "tiny_a"), str(out), 16)
    committed = os.path.join(REPO, "tests", "models", "tiny_a_fp8")
    names = sorted(os.listdir(committed))
    assert sorted(os.listdir(out)) == names
    match, mismatch, errors = filecmp.cmpfiles(committed, str(out), names,
                                               shallow=False)
    assert mismatch == [] and errors == [], (mismatch, errors)
