"""The task file's schema and the models a task names: every knob checked with one line, a
task file round-trips through its TOML text, the built-in models fit any input shape, an
import path builds the user's model, and two models' signatures tell whether they match."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcure_app.config import build_config
from fedcure_app.data.task import TaskConfig, TaskFileError, load_task, parse_task, task_toml
from fedcure_app.models import (
    ModelImportError,
    build_model,
    cycles_key,
    model_signature,
)


def image_task(**kw) -> TaskConfig:
    base = {"classes": ["cat", "dog"], "input-shape": [1, 12, 12]}
    base.update(kw)
    return parse_task(base)


@pytest.mark.parametrize("data, words", [
    ({"classes": ["a"], "input-shape": [1, 8, 8]}, "classes"),
    ({"classes": ["a", "a"], "input-shape": [1, 8, 8]}, "listed twice"),
    ({"classes": ["a", "b\x1b[2J"], "input-shape": [1, 8, 8]}, "printable"),
    ({"classes": ["a", "b"]}, "input-shape"),
    ({"classes": ["a", "b"], "kind": "tabular"}, "features"),
    ({"classes": ["a", "b"], "kind": "tabular", "features": 3, "model": "cnn"}, "cnn"),
    ({"classes": ["a", "b"], "input-shape": [1, 8, 8], "model": "mnist"}, "mnist"),
    ({"classes": ["a", "b"], "input-shape": [3, 8, 8], "mean": [0.1]}, "mean"),
    ({"classes": ["a", "b"], "input-shape": [1, 8, 8], "std": [0.0]}, "std"),
    ({"classes": ["a", "b"], "input-shape": [1, 8, 8], "model": "no such"}, "import path"),
    ({"classes": ["a", "b"], "input-shape": [1, 8, 8], "colour": 1}, "unknown key"),
])
def test_a_bad_task_is_one_line_naming_what_is_wrong(data, words):
    with pytest.raises(TaskFileError) as err:
        parse_task(data, "task.toml")
    text = str(err.value)
    assert "\n" not in text and words in text and text.startswith("task.toml: ")


def test_the_model_defaults_to_a_cnn_for_images_and_an_mlp_for_tables():
    assert image_task().model == "cnn"
    assert parse_task({"classes": ["a", "b"], "kind": "tabular", "features": 4}).model == "mlp"


@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("C",)), min_size=1,
                        max_size=12), min_size=2, max_size=6, unique=True),
       st.integers(1, 4), st.integers(1, 40), st.integers(1, 40), st.booleans())
@settings(max_examples=40, deadline=None)
def test_a_task_file_reads_back_what_was_written(tmp_path_factory, classes, c, h, w, resize):
    task = parse_task({"classes": classes, "input-shape": [c, h, w], "resize": resize,
                       "mean": [0.5] * c, "std": [0.25] * c})
    path = tmp_path_factory.mktemp("task") / "task.toml"
    path.write_text(task_toml(task), encoding="utf-8")
    assert load_task(path) == task


def test_a_task_file_without_a_task_table_is_refused(tmp_path):
    path = tmp_path / "task.toml"
    path.write_text("[data]\nx = 1\n")
    with pytest.raises(TaskFileError, match="no \\[task\\] table"):
        load_task(path)
    with pytest.raises(TaskFileError, match="not found"):
        load_task(tmp_path / "missing.toml")


def test_the_configuration_carries_the_task_and_checks_its_classes():
    task = image_task()
    cfg = build_config({"task": task.model_dump(), "federation": {"num_classes": 2}})
    assert cfg.task == task
    again = build_config(cfg.model_dump(mode="json", by_alias=True))
    assert again.task == task
    with pytest.raises(ValueError, match="num_classes"):
        build_config({"task": task.model_dump()})  # 10 classes by default, the task has 2


@given(st.integers(1, 3), st.integers(1, 33), st.integers(1, 33), st.integers(2, 12))
@settings(max_examples=30, deadline=None)
def test_the_small_cnn_takes_any_image_size(c, h, w, n):
    task = parse_task({"classes": [f"c{i}" for i in range(n)], "input-shape": [c, h, w]})
    out = build_model(task)(torch.zeros(2, c, h, w))
    assert out.shape == (2, n)


def test_the_mlp_takes_feature_rows_and_its_cycles_follow_its_flops():
    task = parse_task({"classes": ["a", "b", "c"], "kind": "tabular", "features": 13})
    assert build_model(task)(torch.zeros(5, 13)).shape == (5, 3)
    key = cycles_key(task)
    assert key.startswith("flops:") and int(key.split(":")[1]) > 0
    from fedcure_app.devices import sample_population

    profile = sample_population(1, seed=0)[0]
    flops = int(key.split(":")[1])
    bigger = profile.cycles_for(f"flops:{2 * flops}")
    assert bigger == pytest.approx(2 * profile.cycles_for(key))


def test_an_import_path_builds_the_users_model(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import torch
        def tiny(input_shape, num_classes):
            return torch.nn.Sequential(torch.nn.Flatten(),
                                       torch.nn.Linear(input_shape[0], num_classes))
        def broken(input_shape, num_classes):
            raise RuntimeError("no GPU here")
        def not_a_model(input_shape, num_classes):
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_models", None)
    base = {"classes": ["a", "b"], "kind": "tabular", "features": 6}
    model = build_model(parse_task({**base, "model": "my_models:tiny"}))
    assert model(torch.zeros(1, 6)).shape == (1, 2)
    for path, words in (("my_models:broken", "raised RuntimeError: no GPU here"),
                        ("my_models:not_a_model", "not a torch.nn.Module"),
                        ("my_models:absent", "no callable absent"),
                        ("no_such_module_here:f", "cannot import no_such_module_here")):
        with pytest.raises(ModelImportError) as err:
            build_model(parse_task({**base, "model": path}))
        assert words in str(err.value) and path in str(err.value)


def test_signatures_match_only_for_the_same_architecture():
    a = build_model(image_task())
    b = build_model(image_task())
    c = build_model(image_task(**{"input-shape": [1, 16, 16]}))
    assert model_signature(a) == model_signature(b)
    assert model_signature(a) != model_signature(c)
