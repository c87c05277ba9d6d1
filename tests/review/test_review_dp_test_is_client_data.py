"""Review rr10 (FINDING, low, fails today): ``Federation(test=(x, y))`` with a tuple that IS one
client's training records (the very objects passed in ``clients``) is taken as the caller's held-out
set, so per-round accuracy/loss on those records are released without noise and ``not_covered``
stays silent. The project's own DP tests pass ``test=clients[0]``. The identity (or shared memory)
is cheap to detect; not_covered should name it, as it names ``test=None``.
"""

import numpy as np
from torch import nn

import fedsec


def test_test_set_identical_to_a_clients_records_is_named():
    rng = np.random.default_rng(0)
    clients = []
    for _ in range(3):
        x = rng.normal(size=(40, 3)).astype(np.float32)
        clients.append((x, (x[:, 0] > 0).astype(np.int64)))
    result = fedsec.Federation(model=nn.Linear(3, 2), clients=clients, test=clients[0], secure=None,
                               dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0), rounds=1,
                               batch_size=8).run()
    assert any("test" in entry for entry in result.not_covered), result.not_covered
