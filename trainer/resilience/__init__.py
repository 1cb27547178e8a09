"""Every NVRx touchpoint of the trainer, so the rest of it reads like plain PyTorch.

- timeouts.py: every timeout and port, checked to nest (tier 1 inside tier 2);
- inprocess.py: tier 1, the NVRx in-process Wrapper made safe and fast on CPU/gloo;
- heartbeat.py, termination.py: tier 2, ft_launcher heartbeats and the SIGTERM path;
- hangtimeout.py: tier 2's hang timeout calculated from the measured step time;
- compat.py: workarounds for NVRx paths that call CUDA unconditionally, and NVRx API details.

Modules are imported where used (not here): importing NVRx costs time a config error should not pay.
"""
