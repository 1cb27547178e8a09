"""The trainer's flag parser: argparse whose every rejection is one `config error: <field>: why` line.

Plain argparse prints a usage block and `error: argument --seq-len: invalid int value: ...`, and its
`int`/`float` accept more than a user wrote: `float("nan")`, `float("1e999")` (inf), `int("١٢")` (Arabic-Indic
digits), `int("1_000")`, surrounding whitespace. Here an integer is ASCII digits with an optional sign
that fit in int64, a float is a finite ASCII decimal, and anything else stops with the flag named, so a
value either reaches TrainConfig exactly as written or does not get past the parser.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from trainer.config.settings import ConfigError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def int64(text: str) -> int:
    """An integer flag: optional minus and ASCII digits, within int64 (seeds and steps reach torch/numpy)."""
    if not _INT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be an integer (ASCII digits), got {text!r}")
    value = int(text)
    if not INT64_MIN <= value <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"must fit in a 64-bit integer, got {text!r}")
    return value


def finite_float(text: str) -> float:
    """A float flag: an ASCII decimal number whose value is finite (no nan, inf or 1e999)."""
    if not _FLOAT.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be a finite decimal number, got {text!r}")
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r} (= {value})")
    return value


# Actions a flag may legitimately repeat: each occurrence adds (--fault A --fault B) or counts.
_REPEATABLE = (argparse._AppendAction, argparse._CountAction, argparse._HelpAction)


class FlagParser(argparse.ArgumentParser):
    """ArgumentParser with strict `type=int`/`type=float` and ConfigError instead of usage + exit 2.

    No abbreviations (`--ste=5` is not `--steps`) and no flag given twice (`--steps=1000 --steps=5` would
    silently run 5): either would let a later argument override a value a layer above already checked.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        # add_argument(type=int) looks its type up in this registry first: swap in the strict parsers
        # without touching every option's definition.
        self.register("type", int, int64)
        self.register("type", float, finite_float)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._refuse_repeats(sys.argv[1:] if args is None else list(args))
        return super().parse_known_args(args, namespace)

    def _refuse_repeats(self, args: list[str]) -> None:
        """A flag (or its --no- form) given twice before `--` is an error naming it."""
        seen: dict[str, str] = {}
        for token in args:
            if token == "--":
                break
            if not token.startswith("--"):
                continue
            option = token.split("=", 1)[0]
            action = self._option_string_actions.get(option)
            if action is None or isinstance(action, _REPEATABLE):
                continue
            if action.dest in seen:
                name = action.option_strings[0]  # --inprocess for --no-inprocess too: one field
                self.error(f"argument {name}: given twice ({seen[action.dest]} and {token}); give it once")
            seen[action.dest] = token

    def error(self, message: str) -> NoReturn:
        raise ConfigError(_field_of(message), _why_of(message))


_ARGUMENT = re.compile(r"argument (?P<opts>[^:]+): (?P<why>.*)", re.DOTALL)


def _field_of(message: str) -> str:
    """`argument --seq-len: ...` -> seq_len; `the following arguments are required: --data-path` ->
    data_path; anything else (unrecognized arguments) -> arguments."""
    match = _ARGUMENT.match(message)
    if match:
        first = match["opts"].split("/")[0]
    elif "required:" in message:
        first = message.split("required:", 1)[1].split(",")[0]
    else:
        return "arguments"
    return first.strip().lstrip("-").replace("-", "_") or "arguments"


def _why_of(message: str) -> str:
    match = _ARGUMENT.match(message)
    return match["why"] if match else message
