"""Review 8 (barrier cut, low): a statistics layer set up *without* its contribution (the late input
of the cut) takes whatever statistics contribution is pending at its masked-input stage, consumes
it in ``site.db``, and only then checks its length (``SiteLayer.handle``: ``supply()`` before
``vector.shape != (self.length,)``). A coordinator that sets up a late statistics layer labelled
round 0, then asks the site for its feature moments (a ``moments`` job: a pending statistics
contribution of round 0 of another length), then sends the layer's masked input, gets a
``NO_INPUT`` refusal, and the site's moments are recorded as used although they went into no
aggregation: the site can no longer take part in the federation's standardisation
(``contribution.used``). The project's rule is that bad input gets a typed error *and loses
nothing*; before the cut a statistics setup always named the contribution it took, so a length
mismatch could not burn one.

Adversary: the coordinator alone, against the unmodified ``SiteJobs`` / ``MaskingSite`` /
``SiteWork`` / ``site.db`` (the harness of tests/fedsec/network/test_two_sessions.py).

Fixed (session 8): ``SiteWork.contribution`` takes the late layer's ``kind`` ("evaluation") and
``length`` and refuses a pending contribution that does not match them *before* consuming it.
"""

from __future__ import annotations

import numpy as np
import pytest
from fedsec.fl_core.aggregation import ClientUpdate
from fedsec.protocols.errors import ClientAbort

from fedsec.network import demo
from tests.fedsec.network.test_bundled_jobs import RUN, Party
from tests.fedsec.network.test_two_sessions import N, layer


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> demo.Deployment:
    return demo.prepare(tmp_path_factory.mktemp("late"), N, rounds=3, extra='[dp]\nmode = "none"\n')


def test_a_late_layer_refuses_a_contribution_of_another_length_without_consuming_it(deployment, tmp_path):
    parties = [Party(deployment, k, tmp_path / str(k)) for k in range(N)]
    try:
        party = parties[0]
        work = party.site.work
        features = int(np.prod(work.input_shape))
        assert features != work.evaluation_length  # the moments are not an evaluation's sums
        session = layer(deployment, party.config, 7).open(
            0, [ClientUpdate(c, np.zeros(work.evaluation_length, np.float32), 1.0) for c in range(N)],
            purpose="statistics")
        stage, out = session.outgoing()  # the setup with advertise keys: no statistics pending
        answer, _ = party.send({"kind": "layer", "round": 0, "stage": stage, "purpose": "statistics"}, out[0])
        # refused at the setup since review 8b: a late layer names a round of the plan (1..rounds)
        assert answer["ok"] is False and "outside the plan" in answer["reason"], answer
        assert "statistics" not in party.jobs.layers
        answer, _ = party.send({"kind": "moments", "round": 0, "stage": 1}, b"")  # the site's feature means
        assert answer["ok"] is True, answer
        assert work.pending is not None and work.pending.kind == "moments-1"
        # the late input's own guard: a pending contribution that is not an evaluation's sums of the
        # layer's length is refused without being consumed
        with pytest.raises(ClientAbort, match="not the input"):
            work.contribution("statistics", 0, kind="evaluation", length=work.evaluation_length)
        assert work.pending is not None and not party.state.used(RUN, "moments-1", 0)
        again, _ = party.send({"kind": "moments", "round": 0, "stage": 1}, b"")
        assert again["ok"] is True, again
    finally:
        for p in parties:
            p.close()
