"""Review rr10 (FINDING, fails today): ``nn.Embedding(max_norm=...)`` renormalises, in place and
outside the clipped, noised gradient, exactly the rows the sampled records look up.

Neither Opacus' validator, the independence probe nor the path probe sees it (the rows' renorm is
a side effect on a trainable parameter, not a gradient). One record holding a rare token decides
whether that token's row is shrunk to max_norm: with the canary the released row has norm ~1,
without it ~4, whatever the noise, so one record is told apart with certainty (epsilon = inf).
"""

import torch
from torch import nn

from fedsec.dp import DPSGD, SecureRandom
from fedsec.dp.errors import UnsupportedModelError
from fedsec.protocols.privacy.trainer import per_example_loss


class Bag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 16, max_norm=1.0)
        self.head = nn.Linear(16, 2)

    def forward(self, tokens):
        return self.head(self.emb(tokens).mean(1))


def _row_norm(canary: bool) -> float:
    torch.manual_seed(0)
    model = Bag()
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 6, (20, 4), generator=g)  # tokens 0..5 only
    y = torch.randint(0, 2, (20,), generator=g)
    if canary:
        x[10, 0] = 9  # one record uses the rare token 9
    DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=20, lr=0.1,
          random=SecureRandom.from_seed(0, "emb")).train(model, x, y, per_example_loss)
    return float(model.emb.weight[9].norm())


def test_embedding_max_norm_reveals_one_record():
    try:
        with_canary, without = _row_norm(True), _row_norm(False)
    except UnsupportedModelError:
        return  # refused: defended
    assert abs(with_canary - without) < 0.5, (
        f"row 9's released norm is {with_canary:.3f} with the canary record and {without:.3f} "
        "without it: the in-place max_norm renorm leaks membership outside the noise")


def test_federation_refuses_a_max_norm_embedding_under_dpsgd():
    import numpy as np
    import pytest

    import fedsec

    class FloatBag(Bag):
        def forward(self, tokens):
            return super().forward(tokens.long())

    rng = np.random.default_rng(0)
    clients = [(rng.integers(0, 6, (20, 4)).astype(np.float32), rng.integers(0, 2, 20))
               for _ in range(3)]
    with pytest.raises(ValueError):
        fedsec.Federation(model=FloatBag(), clients=clients, test=clients[0], secure=None,
                          dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0), rounds=1,
                          batch_size=None)
