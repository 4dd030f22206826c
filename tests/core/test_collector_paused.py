"""The collector pause is the process's: overlapping pauses (from several threads, ending
in any order) leave the collector as the first of them found it, never off for good."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from sandboxctl.core.snapshot import collector_paused


@pytest.fixture(autouse=True)
def restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_overlapping_pauses_ending_in_either_order_turn_it_back_on() -> None:
    gc.enable()
    first, second = collector_paused(), collector_paused()
    first.__enter__()
    second.__enter__()  # began while the first had it off
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second is still under way
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_a_collector_off_before_stays_off() -> None:
    gc.disable()
    with collector_paused(), collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
