"""SecureRandom's state: a stream continued from state_dict is the stream that was not cut."""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.dp.errors import InvalidPrivacyParameterError
from fedsec.dp.noise import SecureRandom
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=20)
@given(cuts=st.lists(st.integers(1, 40), min_size=1, max_size=5), tail=st.integers(1, 50))
def test_a_resumed_stream_continues_the_uncut_one(cuts: list[int], tail: int) -> None:
    whole = SecureRandom.from_seed(7, "test")
    cut = SecureRandom.from_seed(7, "test")
    for n in cuts:
        assert np.array_equal(whole.normal(n), cut.normal(n))
    resumed = SecureRandom()
    resumed.load_state_dict(cut.state_dict())
    assert np.array_equal(resumed.words(tail), whole.words(tail))
    assert resumed.state_dict() == whole.state_dict()


def test_a_bad_state_is_refused() -> None:
    with pytest.raises(InvalidPrivacyParameterError, match="32-byte key"):
        SecureRandom().load_state_dict({"key": "00" * 16, "offset": 0})
    with pytest.raises(InvalidPrivacyParameterError, match="offset"):
        SecureRandom().load_state_dict({"key": "00" * 32, "offset": -8})
