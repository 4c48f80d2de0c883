"""Controller replicas sharing one store.

``registry``: each replica registers itself (address, version, last seen) in the store's key/value
table, so every replica can list the live ones (``ListControllers``, ``Welcome.controllers``, join
commands). ``leader``: one replica at a time holds the store's "singleton" lease and runs the work
that must happen once (rollouts, expiry sweeps, join-material refresh); it stops that work at once
when the lease is lost and another replica takes over within seconds. ``work`` wires the
controller's singleton work to the leader; ``rollout_relay`` carries rollout commands taken by a
replica that does not lead to the one that does. With the SQLite store there is one replica: it
registers and leads as soon as it starts.
"""
