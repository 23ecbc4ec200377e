"""The client role: claim a partition, register with the cloud, run a Flower SuperNode.

``fedcure-client`` (:mod:`client.cli`) computes its data and label counts, registers
(``Association.Register``, which answers once coalition formation has run), writes its data file
(:mod:`fedcure_app.flower.node_data`) and starts ``flower-supernode`` to the edge server the cloud
chose, until the cloud reports training done.
"""
