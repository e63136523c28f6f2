"""``python -m bench.soak``."""

from bench.soak.run import main

raise SystemExit(main())
