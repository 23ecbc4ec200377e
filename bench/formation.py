"""Benchmark: FedCure coalition formation at scale (10,000 clients, 100 ESs, 10 classes).

Start: Dirichlet(α = 0.1) label mixes, 100 samples per client, clients on ESs in contiguous
blocks (``layout.synthetic_label_counts(partition="dirichlet", alpha=0.1)``). Goals: reach a
stable partition in ≤ 5 s, and evaluate moves ≥ 50× faster than recomputing Eq. 3 from scratch.

Printed figures:

- time to a stable partition, moves, exact evaluations, initial/final average JSD;
- per-move speed-up: a sample of the run's own accepted moves is replayed; at the state before
  each, the move's ΔΦ is computed (i) from scratch: the moved assignment's coalition label
  counts, then Eq. 3 (``average_pairwise_jsd(coalition_label_counts(...))``, O(N·C + M²C));
  (ii) Eq. 3 alone on incrementally updated counts (O(M²C)); (iii) incrementally
  (``PartitionState.evaluate``, O(M·C)), one move per call and in a batch of 16 as the
  descent evaluates them;
- end to end: wall time per accepted move against the (M − 1) from-scratch evaluations one
  client decision of a from-scratch Algorithm 1 needs.

``--verify`` additionally checks every one of the ~10⁶ allowed moves of the final partition
exactly (incrementally; about a minute) instead of relying on the rigorous bound.

    python3 bench/formation.py [--clients 10000] [--edges 100] [--seed 0] [--verify]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fedcure_app.core.coalition import form_coalitions
from fedcure_app.core.divergence import average_pairwise_jsd, coalition_label_counts
from fedcure_app.core.layout import synthetic_label_counts
from fedcure_app.core.partition_state import PartitionState


def _best_time(fn, repeat: int = 5, number: int = 1) -> float:
    """Best of ``repeat`` timings of ``number`` calls, seconds per call."""
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def _scratch_delta(counts, state: PartitionState, n: int, a: int, base: float) -> float:
    """ΔΦ of one move from scratch: the moved assignment's coalition counts, then Eq. 3."""
    moved = state.assign.copy()
    moved[n] = a
    return average_pairwise_jsd(coalition_label_counts(counts, moved, state.M)) - base


def _eq3_only_delta(state: PartitionState, n: int, a: int, base: float) -> float:
    """ΔΦ of one move by Eq. 3 alone on incrementally updated coalition counts."""
    S = state.S.copy()
    b = state.assign[n]
    S[a] += state.V[n]
    S[b] -= state.V[n]
    return average_pairwise_jsd(S) - base


def replay_speedup(counts, initial, m, history, trajectory, samples: int, seed: int) -> dict:
    """Replay the run's moves; time scratch vs incremental ΔΦ on a sample of them."""
    rng = np.random.default_rng(seed)
    picks = set(np.linspace(0, len(history) - 1, min(samples, len(history))).astype(int))
    state = PartitionState(counts, initial, m)
    N = len(initial)
    t_scratch, t_eq3, t_single, t_batch, worst = [], [], [], [], 0.0
    for step, (n, b, a) in enumerate(history):
        n_arr, a_arr = np.array([n]), np.array([a])
        if step in picks:
            base = state.phi
            scratch = _scratch_delta(counts, state, n, a, base)
            ev = state.evaluate(n_arr, a_arr)
            worst = max(worst, abs(ev.d_f[0] * state.scale - scratch))
            t_scratch.append(_best_time(lambda: _scratch_delta(counts, state, n, a, base), 3))
            t_eq3.append(_best_time(lambda: _eq3_only_delta(state, n, a, base), 3))
            t_single.append(_best_time(lambda: state.evaluate(n_arr, a_arr), 5, 20))
            others = rng.integers(0, N, 64)
            others = others[(state.assign[others] != a) & state.can_leave(others)][:15]
            bn = np.concatenate(([n], others))
            ba = np.full(bn.size, a)
            t_batch.append(_best_time(lambda: state.evaluate(bn, ba), 5, 10) / bn.size)
        ev = state.evaluate(n_arr, a_arr)
        state.apply(ev, 0)
        assert abs(state.phi - trajectory[step + 1]) < 1e-12, "replay diverged"
    return {
        "scratch_s": float(np.mean(t_scratch)),
        "eq3_s": float(np.mean(t_eq3)),
        "single_s": float(np.mean(t_single)),
        "batch_s": float(np.mean(t_batch)),
        "max_abs_diff": worst,
        "sampled": len(t_scratch),
        "final_state": state,
    }


def verify_all(state: PartitionState, chunk: int = 256) -> tuple[int, float]:
    """Exact ΔΦ of every allowed move of ``state``; returns (moves checked, most negative ΔΦ)."""
    N, M = state.assign.size, state.M
    n_all = np.repeat(np.arange(N), M)
    a_all = np.tile(np.arange(M), N)
    ok = (a_all != state.assign[n_all]) & state.can_leave(n_all)
    n_all, a_all = n_all[ok], a_all[ok]
    worst = np.inf
    for lo in range(0, n_all.size, chunk):
        ev = state.evaluate(n_all[lo:lo + chunk], a_all[lo:lo + chunk])
        worst = min(worst, float(ev.d_f.min() * state.scale))
    return int(n_all.size), worst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--edges", type=int, default=100)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--samples", type=int, default=60, help="moves replayed for the speed-up")
    p.add_argument("--verify", action="store_true", help="exactly check every final move")
    args = p.parse_args()

    counts, initial = synthetic_label_counts(args.clients, args.edges, args.classes,
                                             "dirichlet", alpha=args.alpha, seed=args.seed)
    t0 = time.perf_counter()
    res = form_coalitions(counts, initial, args.edges, "fedcure", seed=args.seed)
    wall = time.perf_counter() - t0
    traj = np.array(res.jsd_trajectory)
    print(f"formation: N={args.clients} M={args.edges} C={args.classes} "
          f"Dirichlet alpha={args.alpha} seed={args.seed}")
    print(f"  time to stable        {wall:.2f} s   (goal <= 5 s)")
    print(f"  stable (certified)    {res.stable}")
    print(f"  moves                 {res.moves}")
    print(f"  exact evaluations     {res.evaluations}")
    print(f"  average JSD           {res.initial_jsd:.6f} -> {res.final_jsd:.3e} nats")
    print(f"  trajectory monotone   {bool(np.all(np.diff(traj) < 0))}")

    rep = replay_speedup(counts, initial, args.edges, res.history, res.jsd_trajectory,
                         args.samples, args.seed)
    final = rep["final_state"]
    scratch_final = average_pairwise_jsd(final.S)
    print(f"  final JSD from scratch {scratch_final:.3e} (|diff| "
          f"{abs(scratch_final - res.final_jsd):.1e})")
    print(f"per-move evaluation, {rep['sampled']} of the run's moves replayed "
          f"(max |incremental - scratch| = {rep['max_abs_diff']:.1e}):")
    sc, eq3 = rep["scratch_s"], rep["eq3_s"]
    print(f"  from scratch: counts + Eq. 3        {sc * 1e3:8.3f} ms")
    print(f"  Eq. 3 alone on updated counts       {eq3 * 1e3:8.3f} ms")
    for label, t in (("incremental, one move per call", rep["single_s"]),
                     ("incremental, batch of 16 (as run)", rep["batch_s"])):
        print(f"  {label:34s} {t * 1e6:8.1f} us   speed-up {sc / t:6.1f}x vs scratch, "
              f"{eq3 / t:6.1f}x vs Eq. 3 alone")
    print("  (goal: >= 50x per move vs from-scratch Eq. 3)")
    per_move = wall / max(1, res.moves)
    decision = (args.edges - 1) * rep["scratch_s"]
    print("end to end:")
    print(f"  wall time per accepted move          {per_move * 1e3:8.2f} ms "
          "(screening, exact evaluation, certification)")
    print(f"  one from-scratch client decision     {decision * 1e3:8.2f} ms "
          f"((M-1) Eq. 3 evaluations) -> {decision / per_move:6.1f}x")
    if args.verify:
        t1 = time.perf_counter()
        checked, worst = verify_all(final)
        print(f"verify: {checked} allowed moves evaluated exactly in "
              f"{time.perf_counter() - t1:.1f} s; most negative dPhi = {worst:.3e} "
              f"-> {'stable' if worst >= -1e-12 else 'NOT stable'}")


if __name__ == "__main__":
    main()
