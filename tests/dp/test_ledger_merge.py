"""The ledger merges consecutive events that differ only in their step count, and nothing else."""

from __future__ import annotations

from dataclasses import asdict

from fedsec.dp.ledger import GaussianEvent, PrivacyLedger, SkellamEvent
from hypothesis import given, settings
from hypothesis import strategies as st

gaussians = st.builds(GaussianEvent, noise_multiplier=st.sampled_from([0.5, 1.0, 1.0 + 1e-12]),
                      sample_rate=st.sampled_from([0.01, 1.0]), steps=st.integers(1, 5))
skellams = st.builds(SkellamEvent, l1=st.sampled_from([2.0, 3.0]), l2=st.sampled_from([1.0, 2.0]),
                     variance=st.sampled_from([4.0, 4.5]), steps=st.integers(1, 5))


def merged_by_definition(events: list) -> list[tuple[str, dict]]:
    """The merge as the ledger's docstring states it, from each event's full field dictionary."""
    out: list[tuple[str, dict]] = []
    for event in events:
        fields = asdict(event)
        steps = fields.pop("steps")
        last = {k: v for k, v in out[-1][1].items() if k != "steps"} if out else None
        if out and out[-1][0] == event.kind and last == fields:
            out[-1][1]["steps"] += steps
        else:
            out.append((event.kind, {**fields, "steps": steps}))
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(gaussians, skellams), max_size=12))
def test_consecutive_events_merge_exactly_when_only_steps_differ(events):
    ledger = PrivacyLedger(events)
    assert [(e.kind, asdict(e)) for e in ledger.events] == merged_by_definition(events)
    assert sum(e.steps for e in ledger.events) == sum(e.steps for e in events)
    assert PrivacyLedger.from_dict(ledger.to_dict()).events == ledger.events


def test_a_merged_event_is_validated_and_keeps_its_type():
    ledger = PrivacyLedger([GaussianEvent(1.0, 0.1, 2), GaussianEvent(1.0, 0.1, 3)])
    assert ledger.events == [GaussianEvent(1.0, 0.1, 5)]
    assert type(ledger.events[0]) is GaussianEvent
