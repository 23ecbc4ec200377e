"""``fedcure model``: what comes after training, on the model a run left in its folder.

    fedcure model evaluate RUN --data PATH [--plot confusion.png] [--json]
    fedcure model predict RUN FILE|FOLDER... [--top K]
    fedcure model export RUN --format pt2|onnx|torchscript --out FILE
    fedcure model info RUN

RUN is a run folder (``--out`` of ``simulate``, ``launch``, ``testbed``, ``fedcure-cloud``, or
a ``flwr run`` folder) holding ``model.pt`` and ``task.toml``
(:mod:`fedcure_app.trained.files`). Wrong inputs are one line and exit code 2: a folder
without a model, data whose classes or shapes do not fit the task (naming the file), a model
file that does not match the task, ONNX without its extra.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="evaluate, predict with, export or describe a run's model",
                       description="The model a run left in its folder (model.pt, model.pt2, "
                       "task.toml): evaluate it on new data, predict classes, export it.")
    msub = p.add_subparsers(dest="model_command", metavar="SUBCOMMAND")
    msub.required = True
    ev = msub.add_parser("evaluate", help="accuracy, loss and per-class results on data",
                         description="Evaluate the run's model on all of PATH (any format a "
                         "client reads: class folders, .npz, .csv, datasets folder).")
    ev.add_argument("run", metavar="RUN", help="run folder")
    ev.add_argument("--data", required=True, metavar="PATH", help="test data")
    ev.add_argument("--label-column", default="label", help="label column of CSV data")
    ev.add_argument("--plot", metavar="PNG", help="also draw the confusion matrix here")
    ev.add_argument("--json", action="store_true", help="print the report as JSON")
    ev.set_defaults(func=run_evaluate)
    pr = msub.add_parser("predict", help="the class of image files or CSV rows",
                         description="One line per image file or CSV row: the class name and "
                         "its probability (the top K with --top).")
    pr.add_argument("run", metavar="RUN", help="run folder")
    pr.add_argument("files", nargs="+", metavar="FILE", help="image files, or CSV files whose "
                    "rows are inputs (a label column is ignored); a folder: every such file "
                    "in it")
    pr.add_argument("--top", type=int, default=1, metavar="K", help="classes shown per input")
    pr.add_argument("--label-column", default="label", help="column of CSV rows to ignore")
    pr.add_argument("--json", action="store_true", help="print the predictions as JSON")
    pr.set_defaults(func=run_predict)
    ex = msub.add_parser("export", help="write the model as pt2, onnx or torchscript",
                         description="Write the model with the task's normalisation inside: "
                         "input float32 N×C×H×W pixels in [0, 1] (images) or N×F features, "
                         "output N×classes logits in the task's class order.")
    ex.add_argument("run", metavar="RUN", help="run folder")
    ex.add_argument("--format", required=True, choices=["pt2", "onnx", "torchscript"],
                    help="pt2: torch.export program; onnx: needs pip install 'fedcure[onnx]'; "
                    "torchscript: torch.jit")
    ex.add_argument("--out", required=True, metavar="FILE", help="file to write")
    ex.set_defaults(func=run_export)
    info = msub.add_parser("info", help="task, classes, input shape, parameters, accuracy",
                           description="What the run's model is and what produced it.")
    info.add_argument("run", metavar="RUN", help="run folder")
    info.add_argument("--json", action="store_true", help="print as JSON")
    info.set_defaults(func=run_info)


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.2f} %"


def run_evaluate(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from fedcure_app.trained.use import evaluate_data, load_run, plot_confusion

    run = load_run(args.run)
    report = evaluate_data(run, args.data, args.label_column)
    if args.plot:
        report["plot"] = str(plot_confusion(report, args.plot))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    console = Console()
    console.print(f"{report['data']}: {report['samples']} samples, accuracy "
                  f"{_pct(report['accuracy'])}, loss {report['loss']:.4f}", markup=False)
    t = Table(show_header=True)
    for col in ("class", "accuracy", "support"):
        t.add_column(col, justify="left" if col == "class" else "right")
    for c in report["classes"]:
        t.add_row(c["name"], _pct(c["accuracy"]), str(c["support"]))
    console.print(t)
    if args.plot:
        console.print(f"wrote {report['plot']}", markup=False)
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from fedcure_app.cli.errors import UsageError
    from fedcure_app.trained.use import load_run, predict_files

    if args.top < 1:
        raise UsageError(f"--top {args.top}: must be >= 1")
    run = load_run(args.run)
    got = predict_files(run, args.files, args.top, args.label_column)
    if args.json:
        print(json.dumps(list(got), indent=1))
        return 0
    for row in got:  # printed as each chunk is predicted
        shown = ", ".join(f"{t['class']} {t['probability']:.3f}" for t in row["top"])
        print(f"{row['input']}: {shown}", flush=True)
    return 0


def run_export(args: argparse.Namespace) -> int:
    from fedcure_app.cli.errors import check_new_file
    from fedcure_app.trained.exporting import write_export
    from fedcure_app.trained.use import load_run

    check_new_file(args.out, "--out")
    run = load_run(args.run)
    out = write_export(run.module, run.task, args.format, args.out)
    print(f"wrote {out} ({args.format}; input {_input_text(run.task)}, output N×"
          f"{run.task.num_classes} logits)")
    return 0


def _input_text(task: Any) -> str:
    if task.kind == "image":
        return "float32 N×" + "×".join(map(str, task.sample_shape)) + " in [0, 1]"
    return f"float32 N×{task.features} raw features"


def info_of(run: Any) -> dict[str, Any]:
    """What ``fedcure model info`` shows."""
    task, result = run.task, run.result
    files = sorted(p.name for p in Path(run.folder).iterdir()
                   if p.name in ("model.pt", "model.pt2", "task.toml", "model.json"))
    return {"folder": str(run.folder), "kind": task.kind, "model": task.model,
            "classes": list(task.classes), "input": _input_text(task),
            "parameters": run.num_parameters,
            "produced_by": run.info.get("produced_by"),
            "rounds": result.get("rounds", run.info.get("rounds")),
            "final_accuracy": result.get("final_accuracy", run.info.get("final_accuracy")),
            "evaluation": result.get("evaluation", run.info.get("evaluation")),
            "files": files}


def run_info(args: argparse.Namespace) -> int:
    from fedcure_app.trained.use import load_run

    info = info_of(load_run(args.run))
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    shown = ", ".join(info["classes"][:12]) + (", …" if len(info["classes"]) > 12 else "")
    lines = [("folder", info["folder"]), ("task", f"{info['kind']}, model {info['model']}"),
             ("classes", f"{len(info['classes'])}: {shown}"), ("input", info["input"]),
             ("parameters", f"{info['parameters']:,}"),
             ("produced by", info["produced_by"] or "-"),
             ("rounds", str(info["rounds"]) if info["rounds"] is not None else "-"),
             ("accuracy", _pct(info["final_accuracy"])
              + (f" ({info['evaluation']})" if info["evaluation"] else "")),
             ("files", ", ".join(info["files"]))]
    for label, value in lines:
        print(f"{label:12} {value}")
    return 0


__all__ = ["info_of", "register"]
