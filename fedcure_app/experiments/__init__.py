"""The paper's experiments as code: ``fedcure experiment NAME``.

One module per experiment (``formation`` Fig. 2, ``clustering`` Fig. 3, ``table1`` Table 1,
``efficiency`` Fig. 4, ``rh`` the supplement, ``ablation`` our own), each with ``plan(ctx)`` (the simulations it needs)
and ``analyse(ctx)`` (tables, PNG figures, numbers); :mod:`.suite` runs them over datasets,
:mod:`.report` writes ``report.md``. Budgets (``tiny``/``quick``/``paper``) live in
:mod:`.budget`; the simulations run through :func:`fedcure_app.simulation.engine.simulate`.
"""

#: The paper's experiments: ``fedcure experiment all`` runs every one.
NAMES: tuple[str, ...] = ("formation", "clustering", "table1", "efficiency", "rh")
#: Experiments of our own, run only by name (``ablation``: one knob at a time against the
#: literal reading, and the dip of the formed methods; its results join the report when
#: ``all`` finds them).
EXTRA_NAMES: tuple[str, ...] = ("ablation",)

__all__ = ["EXTRA_NAMES", "NAMES"]
