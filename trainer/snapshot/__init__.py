"""In-memory snapshots: a fault costs at most the steps since the last snapshot (one, at interval 1).

- config.py:  SnapshotConfig (interval, directory) and the run fingerprint (no torch: --check-config).
- store.py:   SnapshotStore: two slots per rank in files on tmpfs (/dev/shm), header written last,
              XXH3-128 checksum computed off the loop; offers only snapshots of this run, world size,
              rank whose headers verify (a load checks the payload).
- budget.py:  do the slots fit in the pod's /dev/shm? (an UnrecoverableError naming snapshot_dir if not)
- ring.py:    which rank keeps which rank's replica (same local rank, next node).
- replica.py: sends each committed snapshot to that rank and pulls it back for a replaced node, over
              replica_net.py (a TCP server per rank) into replica_shelf.py (verified, double-buffered).
- manager.py: what the training loop calls (one object per process, surviving in-process restarts).

A slot holds a save dict encoded by trainer/state/codec.py (the save dict and its plan: trainer/state/).
Which step a restarted rank restores, and from which tier, is agreed in trainer/recovery/restore.py,
which reads this package's offers and replicas; this package imports neither trainer/checkpoint/ nor
trainer/recovery/.

Importing this package does not import torch (trainer/config/train_config.py imports config.py).
"""
