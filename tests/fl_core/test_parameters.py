import numpy as np
import pytest
import torch
from fedsec.fl_core import (
    NonFiniteError,
    ParameterLayout,
    ShapeMismatchError,
    build_model,
    get_vector,
    set_vector,
)

SHAPES = {"logreg": (30,), "mlp": (1, 8, 8), "cnn": (1, 8, 8)}


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn"])
def test_vector_round_trip_is_bit_exact(name):
    model = build_model(name, input_shape=SHAPES[name], n_classes=10, seed=3)
    other = build_model(name, input_shape=SHAPES[name], n_classes=10, seed=4)
    vector = get_vector(model)
    assert vector.dtype == np.float32
    assert vector.shape == (ParameterLayout.of(model).size,)
    assert vector.size == sum(p.numel() for p in model.parameters())
    set_vector(other, vector)
    for a, b in zip(model.parameters(), other.parameters()):
        assert torch.equal(a, b)
    assert get_vector(other).tobytes() == vector.tobytes()


def test_vector_is_a_copy():
    model = build_model("logreg", input_shape=(5,), n_classes=2, seed=0)
    vector = get_vector(model)
    vector[:] = 7.0
    assert not np.allclose(get_vector(model), 7.0)


def test_layout_offsets_follow_named_parameters():
    model = build_model("mlp", input_shape=(4,), n_classes=3, seed=0)
    layout = ParameterLayout.of(model)
    assert layout.names == ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias",
                            "net.4.weight", "net.4.bias")
    assert layout.offsets[1] == 200 * 4 and layout.size == 4 * 200 + 200 + 200 * 200 + 200 + 200 * 3 + 3


@pytest.mark.parametrize("bad", [np.zeros(3, np.float32), np.zeros((31, 1), np.float32)])
def test_wrong_shape_is_rejected(bad):
    model = build_model("logreg", input_shape=(30,), n_classes=2, seed=0)
    with pytest.raises(ShapeMismatchError):
        set_vector(model, bad)


def test_nan_is_rejected_and_model_untouched():
    model = build_model("logreg", input_shape=(30,), n_classes=2, seed=0)
    before = get_vector(model)
    bad = before.copy()
    bad[5] = np.nan
    with pytest.raises(NonFiniteError):
        set_vector(model, bad)
    assert np.array_equal(get_vector(model), before)
