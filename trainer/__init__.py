"""The FSDP2 trainer that runs in every pod (``ft_launcher ... -m trainer``).

Owns: the model and data, checkpoints (trainer/checkpoint/), events and the run summary (metrics), fault
injection, the training loop, and every NVRx touchpoint (trainer/resilience/).
May import: the standard library, torch, nvidia-resiliency-ext, numpy, prometheus-client. Never ``infra``
(the image needs no CDK) and no harness: not ``tools``, ``bench`` or ``goodput``. It meets them only
through Contract 2 (its command line) and Contract 3 (the files it writes) of docs/design.md.
"""
