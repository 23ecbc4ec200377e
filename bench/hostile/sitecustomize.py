"""Two hostile clients for ``bench/nemesis.py --hostile`` and ``bench/hostile_launch.py`` (on
``PYTHONPATH`` of every role they start; inert elsewhere): the client of index ``$NEMESIS_LIAR`` registers 1000× its label
histogram and sample count (consistent, so registration takes them) and says 10⁹ examples in
every reply; the client of index ``$NEMESIS_SHIFT`` answers every edge round with its model
shifted by ``$NEMESIS_SHIFT_BY`` (default 10) on every weight. A process is that client when
its command line names it (``--name client-I``) or its work folder (``…/clientI``)."""

import importlib.abc
import importlib.util
import os
import sys


def _is(index: str) -> bool:
    return bool(index) and any(a == f"client-{index}" or f"/client{index}/" in a
                               or a.endswith(f"/client{index}") for a in sys.argv)


def _liar_association(module) -> None:
    real = module.register

    def register(stub, args, name, data, home, stop, key=""):
        import dataclasses
        data = dataclasses.replace(data, label_counts=[int(c) * 1000 for c in data.label_counts],
                                   samples=int(data.samples) * 1000)
        return real(stub, args, name, data, home, stop, key)
    module.register = register


def _app(module) -> None:
    if _is(os.environ.get("NEMESIS_SHIFT", "")):
        get = module.get_weights
        by = float(os.environ.get("NEMESIS_SHIFT_BY", "10"))
        module.get_weights = lambda model: [w + by for w in get(model)]
    if _is(os.environ.get("NEMESIS_LIAR", "")):
        record = module.MetricRecord

        def forged(values):
            if "num-examples" in values:
                values = {**values, "num-examples": 10**9}
            return record(values)
        module.MetricRecord = forged


class _Hostile(importlib.abc.MetaPathFinder):
    """Patches a module once it is executed (``client.association``, the ClientApp)."""

    def __init__(self) -> None:
        self.patches = {"client.association": _liar_association,
                        "fedcure_app.flower.client_app": _app}

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if patch is None or (name == "client.association"
                             and not _is(os.environ.get("NEMESIS_LIAR", ""))):
            return None
        del self.patches[name]
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            if self.patches:
                sys.meta_path.insert(0, self)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)
        spec.loader.exec_module = exec_module
        return spec


if os.environ.get("NEMESIS_LIAR") or os.environ.get("NEMESIS_SHIFT"):
    sys.meta_path.insert(0, _Hostile())
