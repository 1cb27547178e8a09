"""In-memory snapshots: a fault costs at most the steps since the last snapshot (one, at interval 1).

- config.py:  SnapshotConfig (interval, directory) and the run fingerprint (no torch: --check-config).
- codec.py:   a checkpoint save dict <-> JSON skeleton + the rank's local tensors (FSDP2 shards).
- store.py:   SnapshotStore: two slots per rank in files on tmpfs (/dev/shm), header written last,
              XXH3-128 checksum computed off the loop; offers only snapshots of this run, world size,
              rank whose headers verify (a load checks the payload).
- budget.py:  do the slots fit in the pod's /dev/shm? (an UnrecoverableError naming snapshot_dir if not)
- restore.py: every rank agrees on the newest step all can restore (memory, shm, peer, then the
              node-local checkpoint: trainer/checkpoint/local_restore.py), else the durable checkpoint;
              the `restore` event's `source` says which.
- ring.py:    which rank keeps which rank's replica (same local rank, next node).
- replica.py: sends each committed snapshot to that rank and pulls it back for a replaced node, over
              replica_net.py (a TCP server per rank) into replica_shelf.py (verified, double-buffered).
- manager.py: what the training loop calls (one object per process, surviving in-process restarts).

Importing this package does not import torch (trainer/config/train_config.py imports config.py).
"""
