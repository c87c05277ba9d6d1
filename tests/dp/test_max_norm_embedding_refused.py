"""``nn.Embedding(max_norm=...)`` renormalises, in place and outside the clipped, noised gradient,
exactly the rows the sampled records look up, so DP-SGD refuses it. One record holding a rare token decides
whether that token's row is shrunk to max_norm: with the canary the released row has norm ~1,
without it ~4, whatever the noise, so one record is told apart with certainty (epsilon = inf).
"""

import numpy as np
import pytest
import torch
from fedsec.dp import DPSGD, SecureRandom
from fedsec.dp.errors import UnsupportedModelError
from fedsec.protocols.privacy.trainer import per_example_loss
from torch import nn

import fedsec


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


def test_dpsgd_refuses_a_max_norm_embedding():
    with pytest.raises(UnsupportedModelError, match="'emb' is an nn.Embedding with max_norm"):
        _row_norm(True)


def test_the_same_embedding_without_max_norm_trains_on_integer_valued_floats():
    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 16)
            self.head = nn.Linear(16, 2)

        def forward(self, tokens):
            return self.head(self.emb(tokens.long()).mean(1))

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 6, (20, 4), generator=g).float()  # synthetic probe inputs stay in 0..5
    y = torch.randint(0, 2, (20,), generator=g)
    before = Plain()
    model = Plain()
    model.load_state_dict(before.state_dict())
    DPSGD(noise_multiplier=1.0, max_grad_norm=1.0, batch_size=20, lr=0.1,
          random=SecureRandom.from_seed(0, "emb")).train(model, x, y, per_example_loss)
    assert not torch.equal(model.emb.weight, before.emb.weight)


def test_federation_refuses_a_max_norm_embedding_under_dpsgd():
    class FloatBag(Bag):
        def forward(self, tokens):
            return super().forward(tokens.long())

    rng = np.random.default_rng(0)
    clients = [(rng.integers(0, 6, (20, 4)).astype(np.float32), rng.integers(0, 2, 20))
               for _ in range(3)]
    with pytest.raises(ValueError, match="max_norm"):
        fedsec.Federation(model=FloatBag(), clients=clients, test=clients[0], secure=None,
                          dp=fedsec.DP(mode="dpsgd", noise_multiplier=1.0), rounds=1,
                          batch_size=None)
