"""FedSGD with full batches, and FedAvg with E=1 and a full batch, are one step of centralised GD."""

import numpy as np
import pytest
import torch
from fedsec.fl_core.models import classification_loss

from fedsec import fl_core

LR = 0.3


def _centralised_step(model, data):
    pooled = data.pooled()
    model.zero_grad()
    classification_loss(model(torch.from_numpy(pooled.x)), torch.from_numpy(pooled.y)).backward()
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
    return fl_core.get_vector(model) - LR * grad


@pytest.mark.parametrize("dataset,model_name,partition", [
    ("breast_cancer", "logreg", "unbalanced"), ("digits", "mlp", "dirichlet"), ("digits", "cnn", "shards")])
@pytest.mark.parametrize("algorithm", ["fedsgd", "fedavg"])
def test_one_round_equals_centralised_gradient_descent(dataset, model_name, partition, algorithm):
    data = fl_core.load_federated(dataset, n_clients=5, partition=partition, alpha=0.3,
                                  rng=np.random.default_rng(0))
    model = fl_core.build_model(model_name, input_shape=data.input_shape, n_classes=data.n_classes,
                                seed=2)
    expected = _centralised_step(model, data)
    if algorithm == "fedsgd":
        strategy = fl_core.FedSGD(lr=LR)
    else:
        strategy = fl_core.FedAvg(trainer=fl_core.SGDTrainer(epochs=1, batch_size=0, lr=LR))
    data = fl_core.FederatedDataset(data.name, data.clients, data.test, data.n_classes,
                                    data.input_shape, standardize=False)
    server = fl_core.FederatedServer(model=model, data=data, strategy=strategy,
                                     protocol=fl_core.PlainAggregation(), rounds=1,
                                     rng=np.random.default_rng(0))
    result = server.run()
    assert result.records[0].participants == 5
    np.testing.assert_allclose(result.vector, expected, rtol=1e-5, atol=1e-6)
