"""The fast path: FedCure's patches of Flower's private internals, behind one version gate.

:mod:`fedcure_app.flower.fastpath.gate` decides, once for every patch, whether the installed
Flower is one the patches were written for (the range is FedCure's own requirement on Flower).
Outside it, or with ``FEDCURE_FASTPATH=off``, every patch stays off and Flower runs unchanged.
"""
