"""Client data in every accepted form, and checks that name the client and the row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fedsec


def _clients(k: int = 3, n: int = 20, d: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(k):
        x = rng.normal(size=(n, d))
        out.append((x, (x[:, 0] > 0).astype(np.int64)))
    return out


def _net(d: int = 4, units: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(d, units)


def _fed(clients, **kwargs):
    settings_ = {"model": _net(), "clients": clients, "test": clients[0], "secure": None,
                 "rounds": 2, "batch_size": 8, **kwargs}
    return fedsec.Federation(**settings_)


class PairDataset(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def _final(federation) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in federation.run().model.parameters()]).numpy()


def test_numpy_tensors_lists_and_datasets_train_the_same_model():
    data = _clients()
    base = _final(_fed(data))
    tensors = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in data]
    lists = [(x.tolist(), y.tolist()) for x, y in data]
    datasets = [PairDataset(x, y) for x, y in data]
    tensor_datasets = [torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y))
                       for x, y in data]
    float_labels = [(x, y.astype(np.float64)) for x, y in data]  # 1.0 reads as 1, never truncated
    for form in (tensors, lists, datasets, tensor_datasets, float_labels):
        np.testing.assert_allclose(_final(_fed(form)), base, rtol=1e-6, atol=1e-7)


def test_pandas_frames_with_a_label_column():
    pd = pytest.importorskip("pandas")  # pandas is optional; not installed in the project's venv
    data = _clients()
    frames = [pd.DataFrame(np.c_[x, y], columns=["a", "b", "c", "d", "sick"]) for x, y in data]
    base = _final(_fed(data))
    np.testing.assert_allclose(_final(_fed(frames, label="sick", test=(frames[0], "sick"))), base,
                               rtol=1e-6)
    np.testing.assert_allclose(_final(_fed([(f, "sick") for f in frames], test=data[0])), base,
                               rtol=1e-6)
    with pytest.raises(ValueError, match="client 0: a DataFrame needs its label column"):
        _fed(frames)
    with pytest.raises(ValueError, match="'y' is not among"):
        _fed(frames, label="y")


def test_float_labels_are_refused_with_client_and_row():
    data = _clients()
    x, y = data[1]
    y = y.astype(np.float64)
    y[7] = 0.5
    data[1] = (x, y)
    with pytest.raises(ValueError, match=r"client 1, row 7: label 0\.5 is not an integer"):
        _fed(data)


def test_labels_one_and_two_with_two_classes_are_refused():
    data = _clients()
    data = [(x, y + 1) for x, y in data]  # labels {1, 2}; the model has one unit: 2 classes
    first_two = int(np.flatnonzero(data[0][1] == 2)[0])
    with pytest.raises(ValueError, match=rf"client 0, row {first_two}: label 2 is outside \[0, 2\)"):
        _fed(data)


def test_nan_features_shape_mismatch_and_model_mismatch_name_the_party():
    data = _clients()
    x = data[2][0].copy()
    x[5, 1] = np.nan
    with pytest.raises(ValueError, match="client 2, row 5: features hold NaN"):
        _fed([data[0], data[1], (x, data[2][1])])
    wide = (np.zeros((6, 5)), np.zeros(6, dtype=int))
    with pytest.raises(ValueError, match=r"client 1: samples have shape \(5,\), the model takes \(4,\)"):
        _fed([data[0], wide])
    with pytest.raises(ValueError, match="client 0: the model cannot take samples of shape"):
        _fed(data, model=_net(d=7))
    with pytest.raises(ValueError, match=r"test of client 1, row 0: label 3 is outside \[0, 3\)"):
        _fed(data, model=_net(units=3), test=[data[0], (data[1][0], np.full(20, 3)), data[2]])
    with pytest.raises(ValueError, match="x has 20 rows but y has 19"):
        _fed([data[0], (data[1][0], data[1][1][:19])])


def test_forms_that_are_not_one_entry_per_client_are_refused():
    data = _clients()
    with pytest.raises(ValueError, match="one entry per client"):
        _fed(data[0])
    with pytest.raises(ValueError, match="one test set per client"):
        _fed(data, test=[data[0], data[1]])
    with pytest.raises(ValueError, match="client 0: expected an"):
        _fed([np.zeros((3, 4))])


@settings(max_examples=15)
@given(client=st.integers(0, 2), row=st.integers(0, 19),
       bad=st.sampled_from([-1, 2, 7, 0.25, 1.5, float("nan"), float("inf")]))
def test_one_bad_label_anywhere_is_found_at_its_client_and_row(client, row, bad):
    data = _clients()
    x, y = data[client]
    y = y.astype(np.float64)
    y[row] = bad
    data[client] = (x, y)
    with pytest.raises(ValueError, match=rf"^client {client}, row {row}: label"):
        _fed(data)
