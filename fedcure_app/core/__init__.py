"""Pure FedCure algorithms: numpy/scipy (and scikit-learn for the clustering baselines) only, no
torch, no I/O.

- :mod:`~fedcure_app.core.divergence`: Jensen–Shannon divergence, Eq. 3 (average pairwise JSD).
- :mod:`~fedcure_app.core.coalition`: coalition formation (preference rules, clustering baselines);
  built on :mod:`.partition_state` (incremental ΔΦ), :mod:`.descent` (client sweeps),
  :mod:`.screened` and :mod:`.screening` (large instances), :mod:`.selfish`, :mod:`.clustering`,
  :mod:`.constraints`.
- :mod:`~fedcure_app.core.estimator`: Bayesian coalition latency estimate T̂.
- :mod:`~fedcure_app.core.queues` and :mod:`~fedcure_app.core.scheduler`: virtual queues and the
  FedCure / Greedy / Fair / Random schedulers.
- :mod:`~fedcure_app.core.allocation`: CPU-frequency rule (Theorem 2).
- :mod:`~fedcure_app.core.aggregation`: FedAvg, staleness weight, cloud update.
- :mod:`~fedcure_app.core.weight_cap`: the per-client cap on FedAvg weights.
- :mod:`~fedcure_app.core.layout`: initial federation layouts (label counts).
"""
