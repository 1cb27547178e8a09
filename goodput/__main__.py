"""``python -m goodput``: see goodput.cli."""

from goodput.cli import main

raise SystemExit(main())
