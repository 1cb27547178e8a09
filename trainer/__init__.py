"""The FSDP2 trainer that runs in every pod (``ft_launcher ... -m trainer``).

Owns: the model and data, checkpoints (trainer/checkpoint/) and in-memory snapshots (trainer/snapshot/)
over the state both save (trainer/state/), the agreed choice of restore source above them
(trainer/recovery/), events and the run summary (metrics), fault injection, the training loop, fault
tolerance in the workers (trainer/resilience/) and what runs in the launcher process (trainer/launcher/:
the container's command, the zygote, NVRx's launcher and its patches).
May import: the standard library, torch, nvidia-resiliency-ext, numpy, prometheus-client. Never ``infra``
(the image needs no CDK) and no harness: not ``tools``, ``bench`` or ``goodput``. It meets them only
through Contract 2 (its command line) and Contract 3 (the files it writes) of docs/design.md.
"""
