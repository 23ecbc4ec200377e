"""The Flower adaptation: the ServerApp and ClientApp, the edge's FedAvg rounds over a
Flower Grid, Flower's run config, console scripts, SuperNode auth and message packing.

Everything in FedCure that calls Flower's APIs lives here; the method (``fedcure_app.core``,
``fedcure_app.strategy``) and the roles' own protocol do not.
"""
