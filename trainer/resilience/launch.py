"""`python -m trainer.resilience.launch FT_LAUNCHER [ARG...]`: NVRx's ft_launcher, in this process, with
the one launcher-side workaround of trainer/resilience/compat.py applied (`skip_idle_group_grace`: no
1 s sleep after stopping a worker group that has already exited).

The prefork wrapper (trainer/prefork/__main__.py) execs this instead of the `ft_launcher` script it was
given (Contract 2). FT_LAUNCHER stays in the process's command line, so the launcher and the rank
monitors it forks are still found as "ft_launcher" processes; argv[0] becomes it, and NVRx's own `main`
parses the rest exactly as the script would.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m trainer.resilience.launch FT_LAUNCHER [ARG...]", file=sys.stderr)
        return 2
    from nvidia_resiliency_ext.fault_tolerance import launcher

    from trainer.resilience.compat import skip_idle_group_grace

    skip_idle_group_grace(launcher)
    sys.argv = list(argv)
    launcher.main()  # NVRx's main ends with sys.exit(its exit code)
    return 0  # pragma: no cover - not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
