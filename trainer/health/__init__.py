"""The node health daemon: what ft_launcher asks before it joins each rendezvous round
(`--ft-node-health-check-endpoint`, NVRx's gRPC `nvhcd.HealthCheckService.RunHealthCheck` over a Unix
socket), answered from checks this node can make (docs/operations.md, "Node health"):

- checks.py:   one function per check, each a `CheckResult` that passes, fails or is skipped with the
  reason (its tool or device is absent here): the shared file system (FSx) written, read back and
  removed within a deadline, free space on the node-local NVMe over a floor, the GPUs nvidia-smi sees,
  the EFA devices libfabric's `fi_info -p efa` lists;
- config.py:   `HealthConfig`, the daemon's settings (one dataclass, a docstring per field, the CLI
  built from it, field-named errors);
- report.py:   the results folded into NVRx's reply: `fail_count`, the failed checks, every result;
- server.py:   the gRPC service on a Unix socket (0600 in a pod-private directory: node-local and
  reachable only by the pod's containers that mount it, since NVRx's client speaks UDS without
  credentials), one check round per request, at most one round at a time;
- __main__.py: `python -m trainer.health --socket PATH ...` (the chart's native sidecar), and
  `python -m trainer.health probe --socket PATH` (its startup probe: one call, exit 0 when it answers).

Imports only the standard library, grpc and NVRx's generated protocol modules (never torch, nor another
trainer subpackage): the sidecar starts in well under a second.
"""
