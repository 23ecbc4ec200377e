"""Local training and evaluation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedcure_app import training
from fedcure_app.models import build_model, get_weights, set_weights
from fedcure_app.training import EvalResult, TrainResult, configure_threads, evaluate, train_local


def _toy(n: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Separable 8×8 data: class c lights up row c (4 classes) plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=n).astype(np.int64)
    x = rng.normal(0.0, 0.3, size=(n, 1, 8, 8)).astype(np.float32)
    x[np.arange(n), 0, 2 * y, :] += 2.0
    return x, y


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return build_model("digits", num_classes=4)


def _same(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_training_lowers_the_loss() -> None:
    x, y = _toy()
    model = _model()
    before = evaluate(model, x, y)
    res = train_local(model, x, y, steps=60, lr=0.1, batch_size=16, seed=0)
    after = evaluate(model, x, y)
    assert isinstance(res, TrainResult)
    assert (res.steps, res.samples) == (60, 60 * 16)
    assert math.isfinite(res.loss) and res.seconds > 0
    assert after.loss < 0.5 * before.loss
    assert after.accuracy > 0.9


def test_same_seed_same_weights_bit_for_bit() -> None:
    x, y = _toy()
    a, b, c = _model(), _model(), _model()
    ra = train_local(a, x, y, steps=20, lr=0.05, seed=3, momentum=0.9)
    rb = train_local(b, torch.from_numpy(x), torch.from_numpy(y), steps=20, lr=0.05, seed=3,
                     momentum=0.9)
    train_local(c, x, y, steps=20, lr=0.05, seed=4, momentum=0.9)
    assert _same(a, b)
    assert ra.loss == rb.loss
    assert not _same(a, c)


def test_momentum_changes_the_result() -> None:
    x, y = _toy()
    a, b = _model(), _model()
    train_local(a, x, y, steps=10, lr=0.05, seed=0)
    train_local(b, x, y, steps=10, lr=0.05, seed=0, momentum=0.9)
    assert not _same(a, b)


def test_epochs_equal_the_matching_steps() -> None:
    x, y = _toy(n=50)
    a, b = _model(), _model()
    ra = train_local(a, x, y, epochs=2, lr=0.05, batch_size=16, seed=1)
    rb = train_local(b, x, y, steps=8, lr=0.05, batch_size=16, seed=1)
    assert (ra.steps, ra.samples) == (8, 100)  # 4 batches per epoch: 16, 16, 16, 2
    assert (rb.steps, rb.samples) == (8, 100)
    assert _same(a, b)


def test_each_epoch_visits_every_sample_once(monkeypatch: pytest.MonkeyPatch) -> None:
    x, y = _toy(n=40)
    seen: list[torch.Tensor] = []
    real = torch.Tensor.index_select

    def spy(self: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
        if self.dtype == torch.int64 and self.dim() == 1:
            seen.append(index.clone())
        return real(self, dim, index)

    monkeypatch.setattr(torch.Tensor, "index_select", spy)
    train_local(_model(), x, y, epochs=3, lr=0.01, batch_size=12, seed=0)
    batches = [s.tolist() for s in seen]
    assert [len(b) for b in batches] == [12, 12, 12, 4] * 3
    epochs = [sum(batches[i * 4:(i + 1) * 4], []) for i in range(3)]
    assert all(sorted(e) == list(range(40)) for e in epochs)
    assert epochs[0] != epochs[1]


def test_zero_steps_leave_the_model_alone() -> None:
    x, y = _toy()
    model = _model()
    before = get_weights(model)
    res = train_local(model, x, y, steps=0, lr=0.1)
    assert res.steps == 0 and res.samples == 0 and math.isnan(res.loss)
    assert all(np.array_equal(a, b) for a, b in zip(before, get_weights(model)))


def test_argument_errors() -> None:
    x, y = _toy()
    model = _model()
    with pytest.raises(ValueError, match="exactly one of steps or epochs"):
        train_local(model, x, y, lr=0.1)
    with pytest.raises(ValueError, match="exactly one of steps or epochs"):
        train_local(model, x, y, steps=1, epochs=1, lr=0.1)
    with pytest.raises(ValueError, match="128 inputs but 127 labels"):
        train_local(model, x, y[:-1], steps=1, lr=0.1)
    with pytest.raises(ValueError, match="no samples"):
        train_local(model, x[:0], y[:0], steps=1, lr=0.1)
    with pytest.raises(ValueError, match="lr"):
        train_local(model, x, y, steps=1, lr=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        train_local(model, x, y, steps=1, lr=0.1, batch_size=0)
    with pytest.raises(TypeError, match="list"):
        train_local(model, x.tolist(), y, steps=1, lr=0.1)  # type: ignore[arg-type]


def test_non_float32_numpy_inputs_are_converted() -> None:
    x, y = _toy()
    a, b = _model(), _model()
    train_local(a, x, y, steps=5, lr=0.05)
    train_local(b, x.astype(np.float64), y.astype(np.int32), steps=5, lr=0.05)
    c = _model()
    train_local(c, torch.from_numpy(x).double(), torch.from_numpy(y).int(), steps=5, lr=0.05)
    assert _same(a, b) and _same(a, c)


def test_threads_are_not_reset_on_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    configure_threads()
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: calls.append(n))
    x, y = _toy()
    train_local(_model(), x, y, steps=2, lr=0.05)
    evaluate(_model(), x, y)
    assert calls == []


def test_configure_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    original = torch.get_num_threads()
    try:
        assert configure_threads(1) == 1 and torch.get_num_threads() == 1
        monkeypatch.setenv("FEDCURE_NUM_THREADS", "2")
        assert configure_threads() == 2 and torch.get_num_threads() == 2
        monkeypatch.setenv("FEDCURE_NUM_THREADS", "many")
        with pytest.raises(ValueError, match="FEDCURE_NUM_THREADS"):
            configure_threads()
        with pytest.raises(ValueError, match=">= 1"):
            configure_threads(0)
    finally:
        configure_threads(original)


class _Logits(nn.Module):
    """Parameter-free model: the inputs are the logits."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def test_evaluate_accuracy_bounds_and_loss() -> None:
    y = torch.arange(23) % 10
    right = 5.0 * F.one_hot(y, 10).float()
    wrong = 5.0 * F.one_hot((y + 1) % 10, 10).float()
    model = _Logits()
    good = evaluate(model, right, y, batch_size=7)
    bad = evaluate(model, wrong, y, batch_size=7)
    assert isinstance(good, EvalResult)
    assert (good.accuracy, bad.accuracy, good.samples) == (1.0, 0.0, 23)
    assert good.loss == pytest.approx(F.cross_entropy(right, y).item(), rel=1e-6)
    assert bad.loss == pytest.approx(F.cross_entropy(wrong, y).item(), rel=1e-6)
    half = torch.where((torch.arange(23) % 2 == 0)[:, None], right, wrong)
    assert evaluate(model, half, y).accuracy == pytest.approx(12 / 23)


def test_evaluate_real_model_restores_mode_and_matches_batches() -> None:
    x, y = _toy(n=100)
    model = _model()
    model.train()
    full = evaluate(model, x, y, batch_size=1024)
    chunked = evaluate(model, x, y, batch_size=9)
    assert model.training
    assert 0.0 <= full.accuracy <= 1.0
    assert full.accuracy == chunked.accuracy
    assert full.loss == pytest.approx(chunked.loss, rel=1e-5)


def test_training_continues_from_loaded_weights() -> None:
    x, y = _toy()
    a = _model()
    train_local(a, x, y, steps=5, lr=0.05, seed=0)
    b = _model(seed=9)
    set_weights(b, get_weights(a))
    train_local(a, x, y, steps=5, lr=0.05, seed=1)
    train_local(b, x, y, steps=5, lr=0.05, seed=1)
    assert _same(a, b)


def test_threads_configured_lazily_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(training, "_threads_configured", None)
    monkeypatch.setenv("FEDCURE_NUM_THREADS", str(torch.get_num_threads()))
    x, y = _toy()
    train_local(_model(), x, y, steps=1, lr=0.05)
    assert training._threads_configured == torch.get_num_threads()


def test_evaluate_counts_confusion_and_per_class_accuracy() -> None:
    y = torch.tensor([0, 0, 1, 1, 1, 2])
    pred = torch.tensor([0, 1, 1, 1, 2, 2])  # class 0: 1 of 2, class 1: 2 of 3, class 2: 1 of 1
    logits = 5.0 * F.one_hot(pred, 4).float()
    res = evaluate(_Logits(), logits, y, batch_size=4)
    assert res.confusion == ((1, 1, 0, 0), (0, 2, 1, 0), (0, 0, 1, 0), (0, 0, 0, 0))
    assert res.class_accuracy[:3] == pytest.approx((0.5, 2 / 3, 1.0))
    assert math.isnan(res.class_accuracy[3])  # no sample of class 3
    assert res.accuracy == pytest.approx(4 / 6)


def test_confusion_is_the_same_however_the_batches_are_cut() -> None:
    x, y = _toy(n=100)
    model = _model()
    a = evaluate(model, x, y, batch_size=1024)
    b = evaluate(model, x, y, batch_size=9)
    assert a.confusion == b.confusion
    assert sum(map(sum, a.confusion)) == 100
    assert sum(a.confusion[c][c] for c in range(len(a.confusion))) == round(a.accuracy * 100)


def test_resolve_device_cpu_auto_and_a_missing_gpu() -> None:
    assert training.resolve_device("cpu") == torch.device("cpu")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert training.resolve_device("auto").type == want
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="--device cuda: CUDA is not available"):
            training.resolve_device("cuda")
    with pytest.raises(ValueError, match="device must be one of"):
        training.resolve_device("tpu")


def test_plain_sgd_matches_torch_optim_sgd_bit_for_bit():
    """train_local's own SGD step (no torch.optim import) makes exactly torch.optim.SGD's
    update, also from a model that carries stale gradients."""
    import torch.nn.functional as F

    from fedcure_app.models import build_model
    from fedcure_app.training import train_local

    gen = torch.Generator().manual_seed(3)
    x = torch.rand(70, 1, 8, 8, generator=gen)
    y = torch.randint(0, 10, (70,), generator=gen)
    torch.manual_seed(0)
    ours = build_model("digits", 10)
    ref = build_model("digits", 10)
    ref.load_state_dict(ours.state_dict())
    for p in ours.parameters():
        p.grad = torch.ones_like(p)  # stale: must not leak into the first step
    train_local(ours, x, y, steps=7, lr=0.05, batch_size=16, seed=4)
    opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator(device="cpu").manual_seed(4)
    for i in range(7):  # 5 batches per epoch, a fresh permutation for each epoch
        if i % 5 == 0:
            perm = torch.randperm(70, generator=g)
        b = i % 5
        idx = perm[b * 16:(b + 1) * 16]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(ref(x[idx]), y[idx]).backward()
        opt.step()
    for a, b in zip(ours.state_dict().values(), ref.state_dict().values()):
        assert torch.equal(a, b)


def _pixels(n: int = 96, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """uint8 digits-like pixels (0..16) and labels."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 17, size=(n, 1, 8, 8), dtype=np.uint8),
            rng.integers(0, 4, size=n).astype(np.int64))


def test_uint8_pixels_normalised_per_batch_train_bit_for_bit_like_the_float_split() -> None:
    """A client holding uint8 pixels and normalising each batch (PixelNorm) ends with the very
    weights, loss and evaluation of training on the normalised float32 split."""
    from fedcure_app.data.dataset import normalise
    from fedcure_app.data.specs import SPECS
    from fedcure_app.training import PixelNorm

    x8, y = _pixels()
    xf = normalise(x8, SPECS["digits"])
    norm = PixelNorm.for_dataset("digits")
    a, b = _model(), _model()
    ra = train_local(a, xf, y, steps=7, lr=0.1, batch_size=16, seed=3)
    rb = train_local(b, x8, y, steps=7, lr=0.1, batch_size=16, seed=3, norm=norm)
    assert _same(a, b) and ra.loss == rb.loss and ra.samples == rb.samples
    ea, eb = evaluate(a, xf, y, batch_size=32), evaluate(b, torch.from_numpy(x8), y,
                                                          batch_size=32, norm=norm)
    assert (ea.loss, ea.accuracy, ea.confusion) == (eb.loss, eb.accuracy, eb.confusion)
    assert torch.equal(norm(torch.from_numpy(x8)), torch.from_numpy(xf))


def test_a_pixel_norm_needs_uint8_inputs() -> None:
    from fedcure_app.training import PixelNorm

    x, y = _toy(32)
    with pytest.raises(TypeError, match="uint8"):
        train_local(_model(), x, y, steps=1, lr=0.1, norm=PixelNorm.for_dataset("digits"))


@pytest.mark.parametrize("name", ["digits", "mnist", "cifar10", "svhn", "cinic10"])
def test_pixel_norm_equals_the_split_normalisation_of_every_dataset(name: str) -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from fedcure_app.data.dataset import normalise
    from fedcure_app.data.specs import SPECS
    from fedcure_app.training import PixelNorm

    spec = SPECS[name]
    norm = PixelNorm.for_dataset(name)

    @settings(max_examples=25, deadline=None)
    @given(st.integers(1, 4), st.integers(0, 2**32 - 1))
    def check(n: int, seed: int) -> None:
        x = np.random.default_rng(seed).integers(0, 256, size=(n, *spec.input_shape),
                                                 dtype=np.uint8)
        assert torch.equal(norm(torch.from_numpy(x)), torch.from_numpy(normalise(x, spec)))

    check()
