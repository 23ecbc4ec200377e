"""The live view of a running federation: snapshots (:mod:`.model`), Prometheus metrics
(:mod:`.metrics`), the page and its HTTP server (:mod:`.server`, ``static/``), and the
simulation engine's feed (:mod:`.simulation`). Drivers publish; readers never take their lock."""
