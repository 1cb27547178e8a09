"""The final state digest that proves a faulted run ends bit for bit where a clean one does.

- state_hash.py:           the digest of the whole model and optimizer state and every rank's other
                           checkpointed entries, and of each part (`run_end`'s `state_sha256`, `state_parts`);
- state_digest_sharded.py: the sharded tensors hashed where they lie (no rank gathers them), equal for any
                           sharding of the same state.

Imports no other trainer package.
"""
