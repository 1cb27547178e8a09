"""A rank's training state as both restore tiers save it: the layer below checkpoint/ and snapshot/.

- save_dict.py:  the loop's objects <-> the flat save dict (FSDP2 DTensor shards for model and optimizer,
                 one encoded entry per rank for everything else); a load's rollback; the model's
                 fingerprint; the staging copy an asynchronous save writes from.
- entry_blob.py: a per-rank entry's state dict as one self-describing byte string (nothing pickled).
- codec.py:      a save dict <-> a JSON skeleton and the rank's local tensors (what a snapshot slot holds,
                 and what entry_blob.py encodes with).
- plan.py:       the save dict of each snapshot, built once per attempt and reused while the live tensors
                 stay put.
- cadence.py:    the one rule of when a save is due, shared by checkpoints, snapshots and the
                 configuration's checks (no torch).

Imports nothing of the trainer above it (checkpoint/, snapshot/, recovery/ import it). Importing this
package does not import torch: trainer/config/train_config.py imports cadence.py while it validates the
command line.
"""
