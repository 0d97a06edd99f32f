"""core/quality.py: perplexity from logprobs and the bounds a format may stray."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zenvllm.core import quality


def test_perplexity_of_a_uniform_guess_is_the_number_of_choices():
    assert quality.perplexity([math.log(1 / 2048)] * 10) == pytest.approx(2048)


@given(st.lists(st.floats(min_value=-30, max_value=0), min_size=1, max_size=50))
def test_perplexity_is_exp_of_the_mean_negative_logprob(logprobs):
    expected = math.exp(-sum(logprobs) / len(logprobs))
    assert quality.perplexity(logprobs) == pytest.approx(expected)
    assert quality.perplexity(logprobs) >= 1


@pytest.mark.parametrize("bad", [[], [0.5], [float("nan")], [-math.inf]])
def test_what_is_no_logprob_is_refused(bad):
    with pytest.raises(ValueError):
        quality.perplexity(bad)


def test_a_format_within_its_bound_passes_and_a_wrong_kernel_does_not():
    assert quality.judge("bfloat16", 10.1, 10.0).within
    wrong = quality.judge("bfloat16", 13.0, 10.0)
    assert not wrong.within and "BEYOND" in wrong.said() and "+30.00%" in wrong.said()
    assert not quality.judge("float32", 10.1, 10.0).within  # 1% is beyond float32's
    assert not quality.judge("awq", 5.0, 10.0).within  # better than the model is wrong too


def test_the_bounds_widen_with_the_rounding_of_each_format():
    b = quality.BOUNDS
    assert b["float32"] < b["bfloat16"] < b["w8a8"] < b["awq"] == b["gptq"] < 1


def test_an_unknown_format_or_reference_is_refused_by_name():
    with pytest.raises(ValueError, match="'fp8'"):
        quality.judge("fp8", 1.0, 1.0)
    with pytest.raises(ValueError, match="reference perplexity of 0"):
        quality.judge("float32", 1.0, 0)


def test_greedy_agreement_counts_positions_and_what_a_short_run_lacks():
    assert quality.greedy_agreement([1, 2, 3, 4], [1, 2, 3, 4]) == 1
    assert quality.greedy_agreement([1, 9, 3], [1, 2, 3, 4]) == 0.5
    with pytest.raises(ValueError):
        quality.greedy_agreement([1], [])
