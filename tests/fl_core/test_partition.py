import numpy as np
import pytest
from fedsec.fl_core import PARTITION_SCHEMES, InvalidParameterError, partition_indices
from hypothesis import given
from hypothesis import strategies as st


@st.composite
def pools(draw):
    n = draw(st.integers(1, 300))
    n_classes = draw(st.integers(1, 6))
    labels = np.asarray(draw(st.lists(st.integers(0, n_classes - 1), min_size=n, max_size=n)))
    k = draw(st.integers(1, n))
    return labels, k


@given(pool=pools(), scheme=st.sampled_from(PARTITION_SCHEMES), seed=st.integers(0, 2**32),
       alpha=st.floats(0.01, 10.0), spc=st.integers(1, 4))
def test_every_sample_exactly_once_and_no_empty_client(pool, scheme, seed, alpha, spc):
    labels, k = pool
    if scheme == "shards" and k * spc > labels.size:
        spc = 1
    features = np.random.default_rng(seed).normal(size=(labels.size, 3))
    parts = partition_indices(scheme=scheme, labels=labels, features=features, n_clients=k,
                              rng=np.random.default_rng(seed), alpha=alpha, shards_per_client=spc)
    assert len(parts) == k
    assert all(p.size >= 1 for p in parts)
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(labels.size))


def _partition(scheme, seed=0, k=20, **kw):
    labels = np.repeat(np.arange(10), 100)
    features = np.random.default_rng(1).normal(size=(1000, 4))
    return labels, features, partition_indices(
        scheme=scheme, labels=labels, features=features, n_clients=k, rng=np.random.default_rng(seed), **kw
    )


def test_same_seed_same_partition():
    a = _partition("dirichlet", seed=5, alpha=0.3)[2]
    b = _partition("dirichlet", seed=5, alpha=0.3)[2]
    c = _partition("dirichlet", seed=6, alpha=0.3)[2]
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_iid_sizes_are_equal():
    _, _, parts = _partition("iid")
    assert {p.size for p in parts} == {50}


def test_unbalanced_sizes_are_skewed():
    _, _, parts = _partition("unbalanced")
    sizes = np.array([p.size for p in parts])
    assert sizes.sum() == 1000 and sizes.max() > 3 * sizes.min()


def test_shards_give_each_client_few_labels():
    labels, _, parts = _partition("shards", shards_per_client=2)
    assert {p.size for p in parts} == {50}
    # Shards of 25 samples inside classes of 100: each shard holds exactly one label.
    assert max(np.unique(labels[p]).size for p in parts) <= 2


def _mean_label_entropy(labels, parts):
    total = 0.0
    for p in parts:
        share = np.bincount(labels[p], minlength=10) / p.size
        share = share[share > 0]
        total -= (share * np.log(share)).sum()
    return total / len(parts)


def test_dirichlet_skew_grows_as_alpha_shrinks():
    labels, _, skewed = _partition("dirichlet", alpha=0.1)
    _, _, mild = _partition("dirichlet", alpha=100.0)
    assert _mean_label_entropy(labels, skewed) < 0.6 * _mean_label_entropy(labels, mild)
    assert _mean_label_entropy(labels, mild) > 0.9 * np.log(10)


def test_feature_bias_separates_clients_in_feature_space():
    _, features, parts = _partition("feature_bias", k=4)
    _, _, iid = _partition("iid", k=4)
    spread = lambda ps: np.std([features[p].mean(axis=0) for p in ps], axis=0).sum()  # noqa: E731
    assert spread(parts) > 5 * spread(iid)


@pytest.mark.parametrize(
    "kw",
    [dict(scheme="iid", n_clients=0), dict(scheme="iid", n_clients=11), dict(scheme="nope", n_clients=2),
     dict(scheme="shards", n_clients=4, shards_per_client=3),
     dict(scheme="dirichlet", n_clients=2, alpha=0.0)],
)
def test_bad_partition_arguments(kw):
    labels = np.arange(10) % 2
    with pytest.raises(InvalidParameterError):
        partition_indices(labels=labels, features=np.zeros((10, 2)), rng=np.random.default_rng(0), **kw)
