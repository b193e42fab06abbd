"""The shared argument checks of ``seqjax._checks``: what each accepts and its one message."""

import numpy as np
import pytest

from seqjax._checks import (
    check_optional_positive_int,
    check_positive_int,
    check_positive_ints,
    check_rate,
)


def test_positive_int_takes_python_ints_only_and_positive_ints_numpy_ones_too():
    assert check_positive_int(3, "n") == 3
    check_positive_ints(a=1, b=np.int64(7))
    check_optional_positive_int(None, "n")
    for bad in (0, -2, True, 2.0, np.int64(3)):
        with pytest.raises(ValueError, match=r"`n` must be a positive int; got"):
            check_positive_int(bad, "n")
    for bad in (0, np.int32(-1), np.bool_(True), True, 1.5):
        with pytest.raises(ValueError, match=r"`b` must be a positive int; got"):
            check_positive_ints(a=1, b=bad)
    with pytest.raises(ValueError, match="`n` must be a positive int; got 0"):
        check_optional_positive_int(0, "n")


def test_rate_is_a_real_number_in_zero_one():
    for ok in (0, 0.0, 0.5, np.float32(0.25), np.int64(0)):
        check_rate(ok, "p")
    for bad in (1, 1.0, -0.1, float("nan"), True, np.complex64(0.5), "0.1", None):
        with pytest.raises(ValueError, match=r"`p` must lie in \[0, 1\); got"):
            check_rate(bad, "p")
