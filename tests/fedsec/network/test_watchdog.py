"""The transport's read-deadline watchdog: every armed deadline that is not disarmed fires, in
order, once; a disarmed one never fires; the heap holds only the deadlines in flight when calls
finish in the order they arrive; the watchdog thread is not woken by a deadline later than the
one it waits for."""

from __future__ import annotations

import math
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

    dog.arm(0.3, record("late"))
    cancelled = dog.arm(0.2, record("cancelled"))
    dog.arm(0.02, record("early"))  # earlier than the one the thread waits for: it must be woken
    dog.disarm(cancelled)
    dog.arm(0.4, record("last"))
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


def test_calls_one_after_another_do_not_wake_the_thread() -> None:
    """A server answering one call at a time (a site's pattern): each call arms a deadline later
    than the one the thread waits for and disarms it; the thread is not woken."""
    dog = Watchdog()
    dog.disarm(dog.arm(60.0, lambda: None))
    end = time.monotonic() + 5.0
    while dog._waiting_until == -math.inf and time.monotonic() < end:  # noqa: SLF001 - until it waits
        time.sleep(0.001)
    wakes = [0]
    notify = dog._cond.notify  # noqa: SLF001

    def counted(n: int = 1) -> None:
        wakes[0] += 1
        notify(n)

    dog._cond.notify = counted  # noqa: SLF001
    for _ in range(200):
        dog.disarm(dog.arm(60.0, lambda: None))
    assert wakes[0] == 0
    fired = threading.Event()
    dog.arm(0.02, fired.set)  # earlier than the one it waits for: woken, and fires on time
    assert wakes[0] == 1
    assert fired.wait(5.0)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=1, max_size=12))
def test_any_mix_of_armed_and_disarmed_deadlines(plan: list[tuple[int, bool]]) -> None:
    """Deadlines of 1-40 ms in any order, some disarmed at once: exactly the others fire (a
    deadline whose disarm came after its time, the test thread being descheduled, may fire)."""
    dog = Watchdog()
    fired: list[int] = []
    lock = threading.Lock()
    kept, late = set(), set()
    for index, (ms, cancel) in enumerate(plan):
        def expire(index: int = index) -> None:
            with lock:
                fired.append(index)
        start = time.monotonic()
        handle = dog.arm(ms / 1000, expire)
        if cancel:
            dog.disarm(handle)
            if time.monotonic() - start >= ms / 1000:
                late.add(index)
        else:
            kept.add(index)
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        with lock:
            if kept <= set(fired):
                break
        time.sleep(0.005)
    time.sleep(0.05)
    with lock:
        assert sorted(i for i in fired if i not in late) == sorted(kept)
