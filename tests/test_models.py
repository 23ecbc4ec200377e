"""The paper's CNNs: shapes, weight transfer, sizes and FLOP counts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedcure_app.models import (
    ARCHITECTURES,
    INPUT_SHAPES,
    build_model,
    forward_flops,
    get_weights,
    model_num_bytes,
    model_num_params,
    set_weights,
)

DATASETS = ["digits", "mnist", "cifar10", "svhn", "cinic10"]


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("num_classes", [10, 7])
def test_output_shape(dataset: str, num_classes: int) -> None:
    model = build_model(dataset, num_classes)
    out = model(torch.zeros((4, *INPUT_SHAPES[dataset])))
    assert out.shape == (4, num_classes)
    assert out.dtype == torch.float32


def test_layer_counts_follow_the_paper() -> None:
    def count(model: torch.nn.Module, kind: type) -> int:
        return sum(isinstance(m, kind) for m in model.modules())

    mnist = build_model("mnist")
    assert (count(mnist, torch.nn.Conv2d), count(mnist, torch.nn.MaxPool2d),
            count(mnist, torch.nn.Linear)) == (2, 2, 1)
    cifar = build_model("cifar10")
    assert (count(cifar, torch.nn.Conv2d), count(cifar, torch.nn.MaxPool2d),
            count(cifar, torch.nn.Linear)) == (2, 1, 3)


def test_three_channel_datasets_share_the_cifar_architecture() -> None:
    sizes = {d: model_num_params(build_model(d)) for d in ("cifar10", "svhn", "cinic10")}
    assert len(set(sizes.values())) == 1
    assert ARCHITECTURES["svhn"] == ARCHITECTURES["cinic10"] == "cifar10"


def test_unknown_dataset_and_bad_classes() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'"):
        build_model("imagenet")
    with pytest.raises(ValueError, match="num_classes"):
        build_model("mnist", 1)


def test_dataset_name_is_case_insensitive() -> None:
    assert model_num_params(build_model("MNIST")) == model_num_params(build_model("mnist"))


def test_weights_round_trip() -> None:
    torch.manual_seed(0)
    a = build_model("mnist")
    torch.manual_seed(1)
    b = build_model("mnist")
    x = torch.randn(3, 1, 28, 28)
    assert not torch.equal(a(x), b(x))
    set_weights(b, get_weights(a))
    assert torch.equal(a(x), b(x))
    names = list(a.state_dict())
    assert [w.shape for w in get_weights(a)] == [a.state_dict()[n].shape for n in names]


def test_get_weights_returns_copies() -> None:
    model = build_model("digits")
    before = get_weights(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    after = get_weights(model)
    assert all(not np.array_equal(b, c) for b, c in zip(before, after))


def test_set_weights_casts_float64() -> None:
    model = build_model("digits")
    arrays = [np.full(w.shape, 0.5, dtype=np.float64) for w in get_weights(model)]
    set_weights(model, arrays)
    assert all(np.all(w == 0.5) and w.dtype == np.float32 for w in get_weights(model))


def test_set_weights_shape_mismatch_is_clear_and_changes_nothing() -> None:
    model = build_model("mnist")
    original = get_weights(model)
    bad = [np.zeros_like(w) for w in original]
    bad[2] = np.zeros((64, 32, 3, 3), dtype=np.float32)
    with pytest.raises(ValueError, match=r"shape mismatch for '3\.weight'.*\(64, 32, 5, 5\)"):
        set_weights(model, bad)
    assert all(np.array_equal(a, b) for a, b in zip(original, get_weights(model)))


def test_set_weights_count_mismatch() -> None:
    model = build_model("mnist")
    with pytest.raises(ValueError, match="got 5 arrays but the model has 6 tensors"):
        set_weights(model, get_weights(model)[:5])


def test_sizes() -> None:
    mnist = build_model("mnist")
    # conv1 32·25+32, conv2 64·32·25+64, fc 1024·10+10
    assert model_num_params(mnist) == 832 + 51_264 + 10_250
    assert model_num_bytes(mnist) == 4 * model_num_params(mnist)


def test_forward_flops_by_hand() -> None:
    # mnist: conv1 24·24·32 outputs × 50, conv2 8·8·64 × 1600, fc 10 × 2048
    assert forward_flops(build_model("mnist"), (1, 28, 28)) == 921_600 + 6_553_600 + 20_480
