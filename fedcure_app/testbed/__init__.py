"""``fedcure testbed``'s machinery: real heterogeneity on one Linux machine.

- :mod:`~fedcure_app.testbed.plan`: pure planning of namespace names, interfaces, addresses and
  each link's shaped rates from the device profiles;
- :mod:`~fedcure_app.testbed.netns`: the side effects: network namespaces, veth pairs to one
  bridge, ``tbf`` shaping, commands inside a namespace, removal of a run's (or a crashed run's)
  leftovers by their unique prefix.

CPU speed is the cgroup actuator's job (:mod:`fedcure_app.devices.cgroup`).
"""
