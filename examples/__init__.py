"""Training code that is not the project's: a team's own scripts, run on the blueprint through the public
API. May import `trainer.api` (and its stable names) and any third-party library; never the trainer's
internals, infra, tools, bench, goodput or sizing (tests/test_layout.py)."""
