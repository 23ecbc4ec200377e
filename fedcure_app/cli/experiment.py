"""``fedcure experiment NAME``: the paper's table, figures and supplement, with a report.

``NAME`` is ``formation`` (Fig. 2), ``clustering`` (Fig. 3), ``table1`` (Table 1), ``efficiency``
(Fig. 4), ``rh`` (supplement), ``all`` (every one of those, then ``report.md``) or ``ablation``
(FedCure with one knob changed at a time, and the dip of the formed methods; its own
``report.md`` under ``--out/<dataset>/ablation/``, and a section of the main report once
``all`` is run again). Figures are PNG files under ``--out/<dataset>/<experiment>/``; finished
runs are cached under ``--out/<dataset>/runs`` so an interrupted command resumes (``--fresh``
recomputes, ``--cache-only`` simulates nothing).
"""

from __future__ import annotations

import argparse
import logging
import shlex
import time
from pathlib import Path

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    from fedcure_app.cli.simulate import add_device_option
    from fedcure_app.experiments import EXTRA_NAMES, NAMES

    p = sub.add_parser(
        "experiment",
        help="reproduce the paper's table and figures (plots and a Markdown report)",
        description="Run one of the paper's experiments (or all of them) on one or more "
        "datasets and write PNG figures, summary.json files and, for 'all', report.md.",
    )
    p.add_argument("name", choices=[*NAMES, "all", *EXTRA_NAMES, "peers"],
                   help="which experiment ('all': the paper's five and the report; "
                   "'ablation': one knob at a time, run by name only; 'peers': FedCure "
                   "against FedAvg, HierFAVG, FedBuff and FedAT under one simulated time "
                   "budget)")
    p.add_argument("--dataset", default="digits",
                   help="dataset(s), comma-separated, or 'all' (digits + the paper's four; "
                   "missing ones are skipped); default digits")
    p.add_argument("--data-dir", help="root holding the dataset files (MNIST: its four IDX "
                   "files in DATA_DIR/mnist/raw; default: $FEDCURE_DATA_DIR, else ./data)")
    p.add_argument("--budget", choices=["tiny", "quick", "paper"], default="quick",
                   help="compute budget (default quick: minutes on a 2-core CPU)")
    p.add_argument("--seeds", type=int, help="seeds for Table 1 (default: the budget's)")
    p.add_argument("--side-seeds", type=int,
                   help="seeds for the clustering (Fig. 3) and RH experiments, a prefix of "
                   "Table 1's (default: the budget's, at most --seeds)")
    p.add_argument("--out", default="results/experiments", help="output folder")
    p.add_argument("--threads", type=int,
                   help="torch threads per process (default 1, or $FEDCURE_NUM_THREADS)")
    p.add_argument("--workers", type=int,
                   help="worker processes training a run's clients in parallel (default: "
                   "number of cores; results do not depend on it)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs simulated at once, each in its own process with one worker and "
                   "one torch thread, sharing the run cache (on --device cuda they share the "
                   "GPU); default 1")
    p.add_argument("--executor", choices=["inprocess", "batched"],
                   help="who trains a run's clients: inprocess (one after another, the "
                   "default) or batched (a coalition's clients as one computation: "
                   "same results to float tolerance, a run of its own in the cache)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="batched executor on a GPU: launch each step's kernels one by one "
                   "instead of replaying each edge round as a CUDA graph (same results to "
                   "float tolerance, the same runs in the cache)")
    p.add_argument("--reading", default="literal", choices=list(_readings()),
                   help="reading of what the paper leaves open (default literal; momentum: "
                   "SGD momentum 0.9); its results go to <experiment>-<reading>/ folders")
    add_device_option(p)
    p.add_argument("--fresh", action="store_true", help="ignore cached runs in --out")
    p.add_argument("--cache-only", action="store_true",
                   help="simulate nothing: analyse the runs already cached in --out (missing "
                   "ablation variants are listed as not run yet; other experiments need all "
                   "theirs)")
    p.add_argument("--variants", default="all",
                   help="ablation only: the variants to simulate, comma-separated, from "
                   "literal, batch10, momentum, lr, ell, batch64, tau10, epoch (the others "
                   "are read from the cache or listed as not run yet)")
    p.add_argument("--no-progress", action="store_true", help="no live progress bars")
    from fedcure_app.cli.experiment_peers import add_peer_options

    add_peer_options(p)
    p.set_defaults(func=run)


def _readings() -> tuple[str, ...]:
    from fedcure_app.experiments.readings import READINGS

    return tuple(READINGS)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from fedcure_app.experiments.report import write_report
    from fedcure_app.experiments.suite import parse_datasets, parse_experiments, run_dataset
    from fedcure_app.cli.simulate import checked_device
    from fedcure_app.simulation.executors import resolve_workers
    from fedcure_app.training import configure_threads

    if args.threads is not None and args.threads < 1:
        raise ValueError(f"--threads must be >= 1, got {args.threads}")
    if args.fresh and args.cache_only:
        raise ValueError("--fresh and --cache-only exclude each other")
    device = checked_device(args.device)
    variants = None
    if args.variants != "all":
        if args.name != "ablation":
            raise ValueError("--variants applies to 'fedcure experiment ablation' only")
        from fedcure_app.experiments.ablation import parse_variants
        variants = parse_variants(args.variants)
    configure_threads(args.threads)  # the thread policy (fedcure_app.runtime.threads), logged once
    workers = resolve_workers(args.workers)
    datasets = parse_datasets(args.dataset)
    experiments = [] if args.name == "peers" else parse_experiments(args.name)
    out = Path(args.out)
    _check_inputs(args, datasets, out)
    out.mkdir(parents=True, exist_ok=True)  # every input checked: nothing made before
    console = Console(stderr=True)
    t0 = time.perf_counter()
    outcomes = []
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[acc]}"), TimeElapsedColumn(), TimeRemainingColumn(),
        console=console, disable=args.no_progress,
    ) as progress:
        if args.name == "peers":
            from fedcure_app.cli.experiment_peers import run_peers

            for s in run_peers(args, workers, device, progress):
                progress.console.print(f"[bold]{s.dataset} · {s.title}[/]")
                progress.console.print(s.markdown)
            return 0
        for name in datasets:
            o = run_dataset(name, experiments, data_dir=args.data_dir, budget=args.budget,
                            seeds=args.seeds, out=out, progress=progress, fresh=args.fresh,
                            workers=workers, side_seeds=args.side_seeds, device=device,
                            cache_only=args.cache_only, variants=variants,
                            reading=args.reading, executor=args.executor, jobs=args.jobs,
                            cuda_graphs=args.cuda_graphs)
            outcomes.append(o)
            if o.skipped:
                progress.console.print(f"[yellow]{name}: skipped[/] — {o.skipped}")
            else:
                progress.console.print(
                    f"[green]{name}[/]: {', '.join(o.sections)} done in {o.wall_seconds:.0f} s "
                    f"({o.runs_simulated} runs simulated, {o.runs_cached} from cache)")
    total = time.perf_counter() - t0
    if not any(o.skipped is None for o in outcomes):
        raise ValueError("no dataset could be loaded: " + "; ".join(
            f"{o.name}: {o.skipped}" for o in outcomes))
    out_console = Console()
    for o in outcomes:
        for s in o.sections.values():
            out_console.print(f"[bold]{o.name} · {s.title}[/]")
            out_console.print(s.markdown)
    if args.name == "all":
        path = write_report(outcomes, out, command=_command(args), total_seconds=total,
                            threads=args.threads)
        out_console.print(f"wrote {path}")
    out_console.print(f"figures and summary.json under {out} ({total:.0f} s)")
    return 0


def _check_inputs(args: argparse.Namespace, datasets: list[str], out: Path) -> None:
    """Raise :class:`~fedcure_app.cli.errors.UsageError` (one line naming the option) before
    anything is made: no dataset of ``--dataset`` has its files (the missing ones of several
    are skipped later, with a note), a bad ``--seeds`` or ``--out``."""
    from fedcure_app.cli.errors import UsageError, at_least, check_dataset, check_out_dir
    from fedcure_app.experiments.budget import get_budget

    at_least(args, "seeds", 1)
    at_least(args, "side_seeds", 1)
    at_least(args, "jobs", 1)
    if args.reading != "literal" and args.name == "ablation":
        raise UsageError("--reading: the ablation varies one knob at a time against the literal "
                         "reading; run it without --reading")
    if args.side_seeds is not None:
        try:
            get_budget(args.budget, datasets[0], args.seeds, args.side_seeds)
        except ValueError as err:
            raise UsageError(str(err)) from None
    missing: list[str] = []
    for name in datasets:
        try:
            check_dataset(name, args.data_dir)
            break
        except UsageError as err:
            missing.append(str(err))
    else:
        where = f"--data-dir {args.data_dir}" if args.data_dir else "--data-dir (not given)"
        raise UsageError(f"{where}: no dataset could be loaded: " + "; ".join(
            m.split(": ", 1)[-1] for m in missing))
    check_out_dir(out)


def _command(args: argparse.Namespace) -> str:
    """The command line that reproduces this run (for the report); a data folder is written
    ``DIR`` (where the files lie differs from machine to machine)."""
    parts = ["fedcure", "experiment", args.name, "--dataset", args.dataset,
             "--budget", args.budget, "--out", args.out]
    if args.data_dir:
        parts += ["--data-dir", "DIR"]
    if args.seeds is not None:
        parts += ["--seeds", str(args.seeds)]
    if args.side_seeds is not None:
        parts += ["--side-seeds", str(args.side_seeds)]
    if args.threads is not None:
        parts += ["--threads", str(args.threads)]
    if args.reading != "literal":
        parts += ["--reading", args.reading]
    if args.executor:
        parts += ["--executor", args.executor]
    if args.jobs != 1:
        parts += ["--jobs", str(args.jobs)]
    return " ".join(shlex.quote(p) for p in parts)
