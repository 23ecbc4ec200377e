"""The edge server (ES) role: a Flower SuperLink for its clients plus the edge ServerApp.

``fedcure-edge`` (:mod:`edge_server.cli`) starts ``flower-superlink`` and submits the FedCure
ServerApp to it with ``role = "edge"``; that ServerApp (:mod:`edge_server.serve`) connects to the
cloud (``EdgeLink.Connect``), maps Flower node ids to client ids (:mod:`edge_server.directory`)
and runs every task with :func:`fedcure_app.flower.edge.run_edge_task`, answering with ``Submit``.
"""
