"""The transport's read-deadline watchdog: every armed deadline that is not disarmed fires, in
order, once; a disarmed one never fires; the heap holds only the deadlines in flight when calls
finish in the order they arrive; the watchdog thread is not woken by a later deadline."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from fedsec.network.transport import Watchdog


def test_deadlines_fire_in_order_once_and_disarmed_ones_never() -> None:
    dog = Watchdog()
    fired: list[str] = []
    done = threading.Event()

    def record(name: str):  # noqa: ANN202 - a callback factory
        def expire() -> None:
            fired.append(name)
            if name == "last":
                done.set()
        return expire

    dog.arm(0.15, record("late"))
    cancelled = dog.arm(0.05, record("cancelled"))
    dog.arm(0.02, record("early"))  # earlier than the one the thread waits for: it must be woken
    dog.disarm(cancelled)
    dog.arm(0.25, record("last"))
    assert done.wait(5.0)
    time.sleep(0.05)
    assert fired == ["early", "late", "last"]


def test_an_earlier_deadline_armed_while_the_thread_waits_for_a_later_one_fires_on_time() -> None:
    dog = Watchdog()
    dog.arm(30.0, lambda: None)
    time.sleep(0.05)  # the thread now waits for the 30 s deadline
    fired = threading.Event()
    start = time.monotonic()
    dog.arm(0.05, fired.set)
    assert fired.wait(5.0)
    assert time.monotonic() - start < 5.0


def test_served_in_order_the_heap_holds_only_the_calls_in_flight() -> None:
    dog = Watchdog()
    handles = [dog.arm(60.0, lambda: None) for _ in range(3)]
    for _ in range(5000):
        dog.disarm(handles.pop(0))
        handles.append(dog.arm(60.0, lambda: None))
    assert len(dog._heap) <= 4  # noqa: SLF001 - the bound is the point
    assert len(dog._live) == 3  # noqa: SLF001


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=12))
def test_any_mix_of_armed_and_disarmed_deadlines(plan: list[tuple[int, bool]]) -> None:
    """Deadlines of 1-40 ms in any order, some disarmed at once: exactly the others fire."""
    dog = Watchdog()
    fired: list[int] = []
    lock = threading.Lock()
    kept = set()
    for index, (ms, cancel) in enumerate(plan):
        def expire(index: int = index) -> None:
            with lock:
                fired.append(index)
        handle = dog.arm(ms / 1000, expire)
        if cancel:
            dog.disarm(handle)
        else:
            kept.add(index)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        with lock:
            if len(fired) >= len(kept):
                break
        time.sleep(0.005)
    time.sleep(0.02)
    assert sorted(fired) == sorted(kept)
