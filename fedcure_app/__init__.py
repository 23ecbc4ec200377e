"""FedCure: semi-asynchronous hierarchical federated learning on Flower.

The pure method lives in :mod:`fedcure_app.core`; data, models, devices and training beside it;
the Flower apps, the simulation engine and the deployable roles build on those.
"""

__version__ = "0.1.0"
