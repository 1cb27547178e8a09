"""Fault tolerance inside the worker processes: their NVRx touchpoints, so the rest of the trainer reads
like plain PyTorch.

- timeouts.py: every timeout and port, checked to nest (tier 1 inside tier 2);
- verdict.py: what is retried and what is not: the unrecoverable-error record a later start reads
  before torch, and the repeated-fault bound;
- inprocess.py: tier 1, the NVRx in-process Wrapper made safe and fast on CPU/gloo;
- heartbeat.py, termination.py: tier 2, ft_launcher heartbeats and the SIGTERM path;
- hangtimeout.py: tier 2's hang timeout calculated from the measured step time;
- liveness.py: node beats while a worker group starts (the worker's watch; the beat: trainer/launcher/);
- nvrx_rank_monitor.py: calculated heartbeat timeouts sent through the rank monitor's state protocol.

NVRx's async-checkpoint workarounds live in trainer/checkpoint/nvrx_async.py, the launcher process's
code (the zygote, NVRx's launcher and its patches, the node beat) in trainer/launcher/.

Modules are imported where used (not here): importing NVRx costs time a config error should not pay.
"""
