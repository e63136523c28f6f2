"""``python -m bench.peers``."""

from bench.peers.cli import main

raise SystemExit(main())
