import numpy as np
import pytest
import torch
from fedsec.fl_core import InvalidParameterError, build_model, get_vector
from fedsec.fl_core.models import classification_loss, evaluate, predict


@pytest.mark.parametrize(
    "name,shape,classes,out",
    [("logreg", (30,), 2, 1), ("logreg", (1, 8, 8), 10, 10), ("mlp", (30,), 2, 1),
     ("mlp", (1, 8, 8), 10, 10), ("cnn", (1, 8, 8), 10, 10)],
)
def test_output_shapes(name, shape, classes, out):
    model = build_model(name, input_shape=shape, n_classes=classes, seed=0)
    assert model(torch.zeros((5, *shape))).shape == (5, out)


def test_mlp_is_the_2nn():
    model = build_model("mlp", input_shape=(784,), n_classes=10, seed=0)
    assert get_vector(model).size == 784 * 200 + 200 + 200 * 200 + 200 + 200 * 10 + 10  # 199,210


def test_same_seed_same_init_and_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    a = build_model("cnn", input_shape=(1, 8, 8), n_classes=10, seed=9)
    assert torch.equal(torch.rand(1), expected)
    b = build_model("cnn", input_shape=(1, 8, 8), n_classes=10, seed=9)
    c = build_model("cnn", input_shape=(1, 8, 8), n_classes=10, seed=10)
    assert np.array_equal(get_vector(a), get_vector(b))
    assert not np.array_equal(get_vector(a), get_vector(c))


@pytest.mark.parametrize(
    "kwargs",
    [dict(name="resnet", input_shape=(3,), n_classes=2),
     dict(name="cnn", input_shape=(30,), n_classes=2),
     dict(name="cnn", input_shape=(1, 6, 6), n_classes=2),
     dict(name="logreg", input_shape=(3,), n_classes=1)],
)
def test_bad_model_arguments(kwargs):
    with pytest.raises(InvalidParameterError):
        build_model(seed=0, **kwargs)


def test_binary_loss_is_logistic_loss():
    logits = torch.tensor([[0.0], [2.0], [-1.0]])
    y = torch.tensor([1, 0, 0])
    expected = np.mean([np.log(2), np.log1p(np.exp(2.0)), np.log1p(np.exp(-1.0))])
    assert float(classification_loss(logits, y)) == pytest.approx(expected, rel=1e-6)
    assert predict(logits).tolist() == [0, 1, 0]


def test_evaluate_counts_correct_predictions():
    model = build_model("logreg", input_shape=(2,), n_classes=2, seed=0)
    with torch.no_grad():
        model.linear.weight[:] = torch.tensor([[1.0, 0.0]])
        model.linear.bias[:] = 0.0
    x = np.array([[1, 0], [-1, 0], [2, 0], [-3, 0]], np.float32)
    accuracy, _ = evaluate(model, x, np.array([1, 0, 0, 0]))
    assert accuracy == 0.75
