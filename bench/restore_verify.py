"""What checking tier 1's own snapshot costs a restore from memory.

    python -m bench.restore_verify [--mib 64 256] [--reps 9]

Per size (MiB of model + AdamW state per rank, bench.snapshot's model), one process commits a snapshot
and restores it from its own slot, alternating: with the payload check trainer/recovery/restore.py makes
before the agreement (`SnapshotStore.verify`: XXH3-128 of the whole payload against the digest taken when
the snapshot was made) and without it (a restore that trusted its own memory). Prints medians and ranges
of both restores, of the check alone, and the median paired ratio. Noisy on a shared machine: read the
medians with their spread, and give the load beside them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.snapshot import _state, spread


def measure(mib: int, reps: int) -> dict[str, Any]:
    from trainer.snapshot.store import SnapshotStore
    from trainer.state import codec
    from trainer.state.save_dict import apply_loaded, build_save_dict

    state = _state(mib)
    store = SnapshotStore(Path(tempfile.mkdtemp(dir="/dev/shm")), rank=0, world_size=1, fingerprint="bench")
    store.write(0, build_save_dict(state, 0))
    store.wait()

    def restore(verify: bool) -> tuple[float, float]:
        t0 = time.perf_counter()
        (offer,), _ = store.offers(verify_payload=False)
        t1 = time.perf_counter()
        if verify:
            store.verify(offer)
        t2 = time.perf_counter()
        offer = dataclasses.replace(offer, payload_verified=True)  # the load checks nothing more
        template = build_save_dict(state, 0)
        skel, tensors = codec.flatten(template)
        apply_loaded(state, store.load(offer, template, codec.layout_id(skel, codec.plan(tensors)[0])), 0)
        return time.perf_counter() - t0, t2 - t1

    restore(True), restore(False)  # warm-up
    verified, unverified, check = [], [], []
    for _ in range(reps):
        total, alone = restore(True)
        verified.append(total)
        check.append(alone)
        unverified.append(restore(False)[0])
    payload = store.offers()[0][0].header.payload_bytes
    store.remove()
    store.dir.rmdir()
    return {
        "mib": mib,
        "payload_bytes": payload,
        "restore_verified_s": spread(verified),
        "restore_unverified_s": spread(unverified),
        "verify_s": spread(check),
        "verified_over_unverified": statistics.median(
            a / b for a, b in zip(verified, unverified, strict=True)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    print(json.dumps([measure(m, args.reps) for m in args.mib], indent=1))


if __name__ == "__main__":
    main()
