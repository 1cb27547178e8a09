"""``python -m bench.report``: see bench.report.assemble."""

from bench.report.assemble import main

raise SystemExit(main())
