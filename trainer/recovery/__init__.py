"""Where a (re)started rank gets its state: the one agreed choice among every restore source, above
checkpoint/ and snapshot/ (it imports both; neither imports it).

- restore.py:       every rank agrees on the newest step all can restore: its own snapshot (`memory`, `shm`),
                    a peer's replica (`peer`), the node-local checkpoint (`local`), the durable checkpoint
                    (`fsx`), or a fresh start (`none`); `restore_attempt` is what the step loop calls
                    before its first step.
- local_restore.py: the `local` source: the newest locally sealed step every rank has verified, loaded
                    with DCP from the node's NVMe.

The durable checkpoint's own fallback (newest committed checkpoint that loads) is the checkpoint
manager's (trainer/checkpoint/resume.py); the snapshot tiers' offers and replicas are trainer/snapshot/'s.
"""
