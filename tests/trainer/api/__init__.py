"""Tests of the public API, trainer/api/: the misuse checks, SampleCursor, the RNG streams, the entry
point's resolution and check, and one real run of a team's training function through `job.loop`."""
