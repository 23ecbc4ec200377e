"""Simulator against deployment: one configuration in ``fedcure simulate`` and ``fedcure testbed``.

For each method (default FedCure, FedGreedy, FedFair) it runs the same configuration (device
profiles, seed, formation, scheduler, τ_c, τ_e, K, rounds) twice: on the simulated clock, and in
``fedcure testbed`` (root: every role in its own network namespace, client links shaped to the
profiles' Mbit/s, client CPUs throttled by cgroup quotas to the profiles' speed at the directed
frequency). It prints

- per method and coalition: its devices, the simulator's (predicted) and the testbed's
  (measured) mean task latency, their ratio, and each side's share of the rounds;
- per method: the latency COV (std/mean of the task latencies) in both;
- T̂'s error in the testbed over each coalition's tasks: T̂ (the cloud's estimate before the
  task arrived) / measured − 1, by the coalition's task number (1st, 2nd, 3rd, ...).

The simulator's latency model has compute and transfers only; a deployment adds its messaging
(Flower's SuperLink, SuperNodes and executors, the edge's aggregation) to every edge round, and
each client's own work beyond its training steps (receiving, loading and saving the model),
which runs at the client's device speed. The bench measures both first, in a calibration run of
the testbed (``--calibration-method``, default FedFair, seed + 1, ``--calibration-rounds``
rounds; see :func:`calibrate_overhead`), and every compared run then has them as
``edge-round-overhead-s`` and ``edge-round-client-samples`` (the simulator and the cloud's
latency prior add them). ``--edge-round-overhead A S`` skips the calibration;
``--edge-round-overhead 0 0`` compares against the paper's model alone. Measured latencies
leave out the start-up an edge reports in a coalition's first task (its wait for the
SuperNodes), as T̂ does.

The devices: client i gets entry i of ``--mix`` (as ``fedcure testbed`` deals them; default
two ``rpi4`` among nine clients, so that formation leaves coalitions of mixed devices, where the
edge waits for its slowest client). A testbed client cannot compute faster than one core of
this host, and the clients share the host: in the first dispatch every coalition trains at once.
So every profile is slowed by one common factor (its cycles per sample raised, in both runs
alike; :mod:`fedcure_app.testbed.scaling`): by default the largest under which the clients'
quotas at f_max fit the host's cores less half a core for the roles, with ``--client-cores C``
the one that puts the fastest client at C host cores. The output says how. The simulator has no
edge access caps here (the testbed shapes each client's own link only). The host's one-core
speed is measured once and given to every testbed run.

    sudo python3 bench/testbed.py --dataset mnist --data-dir DIR [--rounds 24] [--tau-e 3]
        [--clients 9] [--edges 3] [--tau-c 20] [--max-concurrent 1] [--mix rpi4,rpi5*4]
        [--methods fedcure,fedgreedy,fedfair] [--out DIR] [--client-cores C]
        [--edge-round-overhead A S]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_inputs(args: argparse.Namespace, out: Path, overhead_s: float = 0.0,
                 client_samples: int = 0, seed: int | None = None, rounds: int | None = None
                 ) -> tuple[Path, Path, float, list[str]]:
    """The shared configuration file (in ``out``), the profiles file, the host's samples/s, and
    the names of the profiles slowed to fit the host; ``overhead_s``: the deployment's
    messaging per edge round (s); ``client_samples``: a client's own work per edge round beyond
    training (samples); ``seed``/``rounds`` override ``args``'."""
    rounds = args.rounds if rounds is None else rounds
    from fedcure_app.cli.testbed import client_profiles, host_samples_per_s, parse_mix
    from fedcure_app.config import FedCureConfig, apply_flat
    from fedcure_app.testbed.scaling import scale_profiles

    cfg = apply_flat(FedCureConfig(), {
        "dataset": args.dataset, "num-clients": args.clients, "num-edges": args.edges,
        "global-rounds": rounds, "tau-c": args.tau_c, "tau-e": args.tau_e,
        "max-concurrent": args.max_concurrent, "seed": args.seed if seed is None else seed,
        "eval-every": rounds, "edge-access-mbps": [], "edge-round-overhead-s": overhead_s,
        "edge-round-client-samples": client_samples,
        **({"data-dir": args.data_dir} if args.data_dir else {})})
    host = args.host_samples_per_s or host_samples_per_s(cfg)
    sc = scale_profiles(client_profiles(cfg, parse_mix(args.mix), None), cfg.data.dataset, host,
                        os.cpu_count() or 1, args.client_cores or None)
    profiles = list(sc.profiles)
    slowed = [p.name for p in profiles] if sc.factor < 1 else []
    prof_file = out / "profiles.json"
    prof_file.write_text(json.dumps([p.model_dump(mode="json") for p in profiles], indent=1))
    cfg = apply_flat(cfg, {"profiles-file": str(prof_file)})
    cfg_file = out / "config.json"
    cfg_file.write_text(cfg.model_dump_json(by_alias=True, indent=1))
    return cfg_file, prof_file, host, sorted(set(slowed))


def scaling(args: argparse.Namespace, host: float) -> Any:
    """How the profiles are slowed to fit this host (:mod:`fedcure_app.testbed.scaling`)."""
    from fedcure_app.cli.testbed import client_profiles, parse_mix
    from fedcure_app.config import FedCureConfig, apply_flat
    from fedcure_app.testbed.scaling import scale_profiles

    cfg = apply_flat(FedCureConfig(), {"dataset": args.dataset, "num-clients": args.clients,
                                       "num-edges": args.edges})
    return scale_profiles(client_profiles(cfg, parse_mix(args.mix), None), args.dataset, host,
                          os.cpu_count() or 1, args.client_cores or None)


def run(kind: str, method: str, cfg_file: Path, prof_file: Path, host: float, out: Path,
        args: argparse.Namespace) -> dict[str, Any] | None:
    """One ``fedcure simulate`` or ``fedcure testbed`` run; its result.json (None on failure)."""
    run_out = out / f"{kind}-{method}"
    argv = [sys.executable, "-m", "fedcure_app.cli", kind, "--config", str(cfg_file),
            "--method", method, "--out", str(run_out), "--no-progress"]
    if kind == "testbed":
        argv += ["--edges", str(args.edges), "--clients", str(args.clients), "--profiles",
                 str(prof_file), "--host-samples-per-s", f"{host:.6g}", "--timeout",
                 str(args.timeout), "--no-progress", "--no-dashboard"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=args.timeout + 300)
    except BaseException:
        # Ctrl-C or the time limit: let the testbed remove its namespaces and cgroups
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
        raise
    done = subprocess.CompletedProcess(argv, proc.returncode, "", stderr)
    print(f"{kind} {method}: exit {done.returncode} in {time.monotonic() - t0:.0f} s",
          file=sys.stderr, flush=True)
    result = run_out / "result.json"
    if done.returncode != 0 or not result.is_file():
        print((done.stderr.strip().splitlines() or ["no output"])[-1], file=sys.stderr)
        return None
    out = json.loads(result.read_text())
    for w in out.get("warnings", []):  # e.g. a busy host, or quotas that do not fit it
        print(f"{kind} {method} warned: {w.get('detail', w)}", file=sys.stderr, flush=True)
    return out


def calibrate_overhead(args: argparse.Namespace, out: Path, host: float) -> tuple[float, int]:
    """The deployment's share of an edge round, measured in a calibration run of the testbed
    (FedFair by default, seed + 1, no overhead in the model): ``(a, S)``, with every task after
    each coalition's first fitted (non-negative least squares) to

        task / τ_e = a + max over its clients of (c·(τ_c·B + S) / f + model down and up) + link / τ_e

    ``a`` (s): messaging per edge round, the same for every device; ``S`` (samples): a client's
    own work per edge round beyond training, at its device's speed (c cycles per sample at the
    applied f GHz). Different device speeds in the calibration run tell the two apart."""
    from scipy.optimize import nnls

    from fedcure_app.devices import PopulationArrays, parse_profile
    from fedcure_app.models import build_model, model_num_bytes

    cal = out / "calibration"
    cal.mkdir(parents=True, exist_ok=True)
    cfg_file, prof_file, _, _ = build_inputs(args, cal, seed=args.seed + 1,
                                             rounds=args.calibration_rounds)
    bed = run("testbed", args.calibration_method, cfg_file, prof_file, host, cal, args)
    if bed is None:
        raise SystemExit("calibration failed: pass --edge-round-overhead S to skip it")
    cfg = bed["config"]
    profiles = [parse_profile(p) for p in json.loads(prof_file.read_text())]
    pop = PopulationArrays.from_profiles(profiles, args.dataset)
    model_bytes = model_num_bytes(build_model(args.dataset))
    spr = int(cfg["method"]["tau-c"]) * int(cfg["method"]["batch-size"])
    link = 2 * 8.0 * model_bytes / (float(cfg["devices"]["edge-link-mbps"]) * 1e6)
    members: dict[int, list[int]] = {}
    for c in bed["clients"]:
        members.setdefault(int(c["edge"]), []).append(int(c["id"]))
    rows, ys, seen = [], [], set()
    for r in bed["records"]:
        m = int(r["coalition"])
        if m not in seen:  # a coalition's first task still pays a warm-up
            seen.add(m)
            continue
        ids = np.array(members[m])
        ghz = r.get("applied_ghz") or r.get("frequencies_ghz") or {}
        f = np.clip([float(ghz.get(str(i), pop.f_max_ghz[i])) for i in ids],
                    pop.f_min_ghz[ids], pop.f_max_ghz[ids])
        base = pop.round_seconds(spr, model_bytes, f, idx=ids)
        slow = int(np.argmax(base))
        rows.append([1.0, pop.cycles_per_sample[ids[slow]] / (f[slow] * 1e9)])
        ys.append((task_seconds(r) - link) / args.tau_e - base[slow])
    if len(rows) < 2:
        raise SystemExit("calibration: too few tasks; raise --calibration-rounds")
    (a, s), _ = nnls(np.array(rows), np.array(ys))
    return float(a), int(round(s))


def task_seconds(record: dict[str, Any]) -> float:
    """A task's latency (s) less the start-up its edge reported (``startup_s``: the wait for
    its SuperNodes, in a coalition's first task), as T̂ learns it; the simulator has none."""
    return float(record["latency_s"]) - float(record.get("startup_s") or 0.0)


def per_coalition(result: dict[str, Any], m: int, skip_first: bool = False) -> dict[str, Any]:
    """Coalition ``m``'s tasks: their number, mean latency (s), share of all tasks and T̂'s
    relative error per task; ``skip_first``: without the coalition's first task."""
    recs = [r for r in result["records"] if int(r["coalition"]) == m][int(skip_first):]
    lat = [task_seconds(r) for r in recs]
    return {"tasks": len(recs), "mean_s": float(np.mean(lat)) if lat else float("nan"),
            "share": len(recs) / max(1, len(result["records"])),
            "t_hat_error": [float(r["estimate_s"]) / task_seconds(r) - 1 for r in recs]}


def cov(result: dict[str, Any]) -> float:
    """The latency COV (std / mean) over all tasks."""
    lat = np.array([task_seconds(r) for r in result["records"]])
    return float(lat.std() / lat.mean()) if lat.size else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="mnist")
    p.add_argument("--data-dir")
    p.add_argument("--edges", type=int, default=3)
    p.add_argument("--clients", type=int, default=9)
    p.add_argument("--rounds", type=int, default=24)
    p.add_argument("--tau-c", type=int, default=20)
    p.add_argument("--tau-e", type=int, default=3)
    p.add_argument("--max-concurrent", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", default="rpi4,rpi5*4",
                   help="device presets dealt to the clients in id order (client i: entry i, "
                   "cycling; NAME*K repeats), as fedcure testbed's --mix")
    p.add_argument("--edge-round-overhead", type=float, nargs=2, default=None,
                   metavar=("A", "S"),
                   help="the deployment's messaging per edge round (A seconds) and a client's "
                   "own work per edge round beyond training (S samples); default: measured by a "
                   "calibration run first; 0 0: the paper's model")
    p.add_argument("--calibration-method", default="fedfair")
    p.add_argument("--calibration-rounds", type=int, default=9)
    p.add_argument("--methods", default="fedcure,fedgreedy,fedfair")
    p.add_argument("--host-samples-per-s", type=float, default=0.0)
    p.add_argument("--client-cores", type=float, default=0.0,
                   help="the fastest client's host cores at f_max (0 < C <= 1): every profile "
                   "is slowed by the same factor, in both runs; default 0: the largest factor "
                   "under which all clients together fit the host's cores less half a core")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--out", help="folder for the runs (default: a temporary one)")
    args = p.parse_args(argv)
    if not 0 <= args.client_cores <= 1:
        p.error("--client-cores must be in (0, 1] (0: the default share)")
    out = Path(args.out or tempfile.mkdtemp(prefix="fedcure-bench-testbed-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()
    cfg_file, prof_file, host, slowed = build_inputs(args, out)
    sc = scaling(args, host)
    shares = {p.name: c for p, c in zip(sc.profiles, sc.cores)}
    print(f"host: {host:.0f} {args.dataset} samples/s on one core; profiles × {sc.factor:.3g}: "
          + ", ".join(f"{n} {c:.3f}" for n, c in sorted(shares.items()))
          + f" host core at f_max ({sc.total_cores:.2f} together)", flush=True)
    args.host_samples_per_s = host
    if args.edge_round_overhead is None:
        overhead, client_samples = calibrate_overhead(args, out, host)
        print(f"calibration ({args.calibration_method} in the testbed, seed {args.seed + 1}, "
              f"{args.calibration_rounds} rounds): each edge round adds {overhead:.2f} s of "
              f"messaging and each client's own work of {client_samples} training samples",
              flush=True)
    else:
        overhead, client_samples = args.edge_round_overhead[0], int(args.edge_round_overhead[1])
    cfg_file, prof_file, host, slowed = build_inputs(args, out, overhead, client_samples)
    profiles = json.loads(prof_file.read_text())
    summary: dict[str, Any] = {"host_samples_per_s": host, "slowed": slowed,
                               "scaling_factor": sc.factor,
                               "client_cores": dict(shares), "methods": {},
                               "edge_round_overhead_s": overhead,
                               "edge_round_client_samples": client_samples, "load_before": load0}
    lines = ["| method | coalition | devices | predicted s | measured s | measured/predicted "
             "| share sim | share testbed |", "|---|---|---|---|---|---|---|---|"]
    covs, errors, ratios = [], {}, []
    for method in args.methods.split(","):
        sim = run("simulate", method, cfg_file, prof_file, host, out, args)
        bed = run("testbed", method, cfg_file, prof_file, host, out, args)
        if sim is None or bed is None:
            summary["methods"][method] = None
            continue
        members = {int(c["edge"]): [] for c in bed["clients"]}
        for c in bed["clients"]:
            members[int(c["edge"])].append(profiles[int(c["id"])]["name"])
        rows = {}
        for m in range(args.edges):
            a, b = per_coalition(sim, m), per_coalition(bed, m)
            rows[m] = {"sim": a, "testbed": b}
            devs = "+".join(sorted(members.get(m, [])))
            ratio = b["mean_s"] / a["mean_s"] if a["tasks"] and b["tasks"] else float("nan")
            ratios.append(ratio)
            lines.append(f"| {method} | {m} | {devs} | {a['mean_s']:.2f} | {b['mean_s']:.2f} | "
                         f"{ratio:.2f} | {a['share']:.2f} | {b['share']:.2f} |")
            errors.setdefault(method, {})[m] = b["t_hat_error"]
        covs.append(f"| {method} | {cov(sim):.3f} | {cov(bed):.3f} |")
        summary["methods"][method] = {"coalitions": rows, "cov_sim": cov(sim),
                                      "cov_testbed": cov(bed)}
    print("\n".join(lines))
    print("\n| method | latency COV simulator | latency COV testbed |\n|---|---|---|")
    print("\n".join(covs))
    print("\nT̂ / measured − 1 in the testbed, by the coalition's task number (1, 2, 3, ...):")
    for method, per in errors.items():
        for m, errs in per.items():
            print(f"- {method}, coalition {m}: " + ", ".join(f"{e:+.0%}" for e in errs))
    late = [e for per in errors.values() for errs in per.values() for e in errs[2:]]
    summary["verdict"] = {
        "measured_over_predicted": [min(ratios, default=float("nan")),
                                    max(ratios, default=float("nan"))],
        "within_20pct": sum(1 for r in ratios if abs(r - 1) <= 0.2), "coalitions": len(ratios),
        "t_hat_error_from_third": [min(late, default=float("nan")),
                                   max(late, default=float("nan"))]}
    v = summary["verdict"]
    print(f"\nmeasured/predicted {v['measured_over_predicted'][0]:.2f}–"
          f"{v['measured_over_predicted'][1]:.2f}: {v['within_20pct']} of {v['coalitions']} "
          f"coalitions within ±20 %; T̂ from each coalition's third task "
          f"{v['t_hat_error_from_third'][0]:+.0%} … {v['t_hat_error_from_third'][1]:+.0%}")
    summary["load_after"] = os.getloadavg()
    print(f"\nload average before {load0[0]:.1f}, after {summary['load_after'][0]:.1f}")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"runs and summary.json in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
