"""Everything that runs in the launcher process, the trainer container's main process (Contract 2 of
docs/design.md), and the zygote it starts:

- __main__.py: `python -m trainer.launcher [--] ft_launcher ...`, the container's command: starts the
  pod's zygote, then execs ft_launcher through ft.py;
- ft.py:       `python -m trainer.launcher.ft FT_LAUNCHER ...`: NVRx's ft_launcher in this process with
  the patches applied and the node beat wired in;
- patches.py:  the NVRx launcher patches, each beside what it patches, with its upstream report and the
  canary test that fails once NVRx fixes it;
- beat.py:     the launcher's node beat while its worker group starts (the workers' side:
  trainer/resilience/liveness.py);
- prefork/:    the zygote that forks warm workers, and the worker's stand-in that asks it for one;
- reaping.py:  the pod's main process and its children: orphans reaped, a dead child's leftovers ended;
- standby.py:  a warm standby process, imported and waiting on a pipe for its start: the next
  ft_launcher of a pod (supervise.py) and the next serving process of the rendezvous service
  (rendezvous.py), so that neither replacement imports torch on the recovery path.

May import the rest of the trainer (resilience/liveness.py for the beat's keys); nothing in the trainer
imports this package except, for `prefork`'s environment names, `forked()` and `launcher_pid()`, the
worker's entry point, the run's start event and the faults. Modules are imported where used, not here:
a worker imports `prefork` at start-up.
"""
