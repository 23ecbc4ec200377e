"""Process plumbing shared by the roles and drivers: child processes, thread policy,
event tracing and the hop table built from its events.
"""
