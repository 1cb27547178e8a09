"""The snapshot payload's checksum (trainer/snapshot/checksum.py): it runs in the snapshot's background
commit while the loop trains the next step, so it must let go of the GIL. xxhash 3.6 held it for the
whole hash (30 ms per 256 MiB here): every snapshot then stalled the loop's next Python call that long."""

from __future__ import annotations

import threading
import time

import torch

from trainer.snapshot.checksum import payload_checksum


def test_the_checksum_is_of_the_bytes() -> None:
    a = torch.arange(1 << 16, dtype=torch.int32).numpy()
    b = a.copy()
    assert (
        payload_checksum(memoryview(a)) == payload_checksum(memoryview(b)) and len(payload_checksum(b)) == 32
    )
    b[12345] ^= 1
    assert payload_checksum(memoryview(a)) != payload_checksum(memoryview(b))


def test_the_checksum_lets_the_loop_thread_run_meanwhile() -> None:
    payload = memoryview(torch.ones(256 << 20, dtype=torch.uint8).numpy())
    hashes, done = 4, threading.Event()

    def commit() -> None:
        for _ in range(hashes):
            payload_checksum(payload)
        done.set()

    thread = threading.Thread(target=commit)
    t0 = time.perf_counter()
    thread.start()
    turns = 0
    while not done.is_set():  # each turn needs the GIL back after a short sleep
        time.sleep(0.0005)
        turns += 1
    thread.join()
    elapsed = time.perf_counter() - t0
    # Holding the GIL per hash allows about one turn per hash; free, a turn per ~0.5-1 ms of hashing.
    assert turns >= 3 * hashes, f"{turns} turns of the loop thread in {elapsed * 1e3:.0f} ms of hashing"
