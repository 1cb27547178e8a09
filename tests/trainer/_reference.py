"""The reference entry point's options in a test's command line (a helper module, not a test module):
tests that build one flat list of options hand them to the trainer the way the chart does, the library's
first and the reference model's (trainer/reference/config.py) after `--`."""

from __future__ import annotations

from collections.abc import Sequence


def reference_flags() -> frozenset[str]:
    from trainer.reference.config import make_parser

    return frozenset(o for a in make_parser()._actions for o in a.option_strings if o.startswith("--"))


def with_reference_last(argv: Sequence[str]) -> list[str]:
    """`argv` with the reference model's options (as `--flag=value` or `--flag value`) moved after `--`;
    an argv that already has `--` is returned as it is."""
    if "--" in argv:
        return list(argv)
    flags = reference_flags()
    library: list[str] = []
    ours: list[str] = []
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.partition("=")[0] in flags:
            takes_next = "=" not in arg and i + 1 < len(args)
            ours += args[i : i + 2] if takes_next else [arg]
            i += 2 if takes_next else 1
        else:
            library.append(arg)
            i += 1
    return [*library, "--", *ours] if ours else library
