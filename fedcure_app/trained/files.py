"""The model files of a run folder, written by every run at its end and read by
``fedcure model`` and ``--init-model``.

- ``model.pt``: the global model's ``state_dict`` with the model's own tensor names
  (``torch.load(path, weights_only=True)``, then ``load_state_dict`` into the task's model);
- ``model.pt2``: a ``torch.export`` program with the task's normalisation inside
  (:mod:`fedcure_app.trained.exporting`), runnable with ``torch.export.load`` alone;
- ``task.toml``: the task (a built-in dataset's equivalent for ``--dataset`` runs:
  :func:`run_task`);
- ``model.json``: what produced the model (command, rounds, accuracy, evaluation).

The model files are written before ``result.json``, so a folder with a result has its model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from fedcure_app.data.task import TaskConfig, TaskFileError, load_task, task_toml

log = logging.getLogger(__name__)

MODEL_PT, MODEL_PT2, TASK_FILE, MODEL_INFO = "model.pt", "model.pt2", "task.toml", "model.json"
#: the weight files ``--init-model`` takes, by suffix
INIT_SUFFIXES: tuple[str, ...] = (".pt", ".pt2", ".safetensors")


class ModelFileError(ValueError):
    """A run folder without a model, or a model file that does not fit the task (one line)."""


def run_task(cfg: Any) -> TaskConfig:
    """The task of a run: ``cfg.task``, or for a built-in dataset its equivalent (classes,
    shape, normalisation on the [0, 1] pixel scale, the paper's CNN)."""
    if cfg.task is not None:
        return cfg.task
    from fedcure_app.data.specs import SPECS
    from fedcure_app.models import ARCHITECTURES

    spec = SPECS[cfg.data.dataset]
    return TaskConfig(kind="image", classes=list(spec.class_names),
                      input_shape=list(spec.input_shape), mean=list(spec.mean),
                      std=list(spec.std), model=ARCHITECTURES[spec.name])


def _atomic(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.stem}.tmp{path.suffix}")  # torch checks the suffix
    write(tmp)
    tmp.replace(path)


def write_model_files(out: str | Path, arrays: list[np.ndarray], task: TaskConfig,
                      info: dict[str, Any]) -> list[Path]:
    """Write ``model.pt``, ``model.pt2`` (skipped with a warning when the model cannot be
    exported), ``task.toml`` and ``model.json`` (``info``) into ``out``; return the paths."""
    import torch

    from fedcure_app.models import build_task_model, set_weights
    from fedcure_app.trained.exporting import NormalisedModel, export_program

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = build_task_model(task)
    set_weights(model, arrays)
    model.eval()
    written = [out / MODEL_PT, out / TASK_FILE, out / MODEL_INFO]
    _atomic(written[0], lambda p: torch.save(model.state_dict(), p))
    _atomic(written[1], lambda p: p.write_text(task_toml(task)))
    _atomic(written[2], lambda p: p.write_text(json.dumps(info, indent=1)))
    try:
        program = export_program(NormalisedModel(model, task), task)
        _atomic(out / MODEL_PT2, lambda p: torch.export.save(program, str(p)))
        written.insert(1, out / MODEL_PT2)
    except Exception as err:  # noqa: BLE001 - a user's model may not be exportable
        log.warning("model.pt2 not written (the model cannot be exported: %s: %s); model.pt "
                    "holds the weights", type(err).__name__, " ".join(str(err).split())[:160])
    return written


def model_info(command: str, result: dict[str, Any]) -> dict[str, Any]:
    """``model.json``: the command that trained the model and the run's numbers."""
    return {"produced_by": command, "rounds": result.get("rounds"),
            "final_accuracy": result.get("final_accuracy"),
            "evaluation": result.get("evaluation"),
            "method": {k: (result.get("config") or {}).get("method", {}).get(k)
                       for k in ("formation", "scheduler")}}


def read_task(folder: str | Path) -> TaskConfig:
    """The task beside a run's model; :class:`ModelFileError` naming the folder without one."""
    path = Path(folder) / TASK_FILE
    try:
        return load_task(path)
    except TaskFileError as err:
        raise ModelFileError(f"{folder}: {err}") from None


def check_state(state: Any, task: TaskConfig, source: str) -> list[np.ndarray]:
    """The arrays of a ``state_dict``-like mapping in the task's model order; :class:
    `ModelFileError` naming the first tensor that is missing or of another shape."""
    import torch

    from fedcure_app.models import build_task_model, model_signature

    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor)
                                              for v in state.values()):
        raise ModelFileError(f"{source}: not a state_dict of tensors")
    want = model_signature(build_task_model(task))
    if [k for k, _ in want] != list(state) and all(k.isdigit() for k in state):
        state = dict(zip([k for k, _ in want], [state[k] for k in sorted(state)]))
    for name, shape in want:
        got = state.get(name)
        if got is None:
            raise ModelFileError(f"{source}: no tensor {name!r}; it does not hold the task's "
                                 f"model ({task.model}, {task.num_classes} classes)")
        if tuple(got.shape) != shape:
            raise ModelFileError(f"{source}: tensor {name!r} has shape {list(got.shape)}, the "
                                 f"task's model ({task.model}, {task.num_classes} classes) "
                                 f"has {list(shape)}")
    extra = sorted(set(state) - {k for k, _ in want})
    if extra:
        raise ModelFileError(f"{source}: tensor {extra[0]!r} is not in the task's model "
                             f"({task.model})")
    return [state[k].detach().to(torch.float32).cpu().numpy() for k, _ in want]


def load_weights(path: str | Path, task: TaskConfig) -> list[np.ndarray]:
    """The weights in ``path`` (``model.pt``, ``model.pt2`` or safetensors: named tensors or
    the cloud's ``final_model.safetensors``) checked against ``task``'s model;
    :class:`ModelFileError` in one line otherwise."""
    import torch

    p = Path(path)
    if not p.is_file():
        raise ModelFileError(f"{p}: no such file")
    suffix = p.suffix.lower()
    try:
        if suffix == ".pt":
            state = torch.load(p, map_location="cpu", weights_only=True)
        elif suffix == ".pt2":
            program = torch.export.load(str(p))
            state = {k.removeprefix("model."): v for k, v in program.state_dict.items()
                     if k.startswith("model.")}
        elif suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(p))
        else:
            raise ModelFileError(f"{p}: not a {', '.join(INIT_SUFFIXES)} file")
    except ModelFileError:
        raise
    except Exception as err:  # noqa: BLE001 - torch/safetensors raise many kinds
        raise ModelFileError(f"{p}: cannot read it ({type(err).__name__}: "
                             f"{' '.join(str(err).split())[:160]})") from None
    return check_state(state, task, str(p))


__all__ = ["INIT_SUFFIXES", "MODEL_INFO", "MODEL_PT", "MODEL_PT2", "ModelFileError",
           "TASK_FILE", "check_state", "load_weights", "model_info", "read_task", "run_task",
           "write_model_files"]
