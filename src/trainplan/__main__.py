"""`python -m trainplan`: the `trainplan` command, started as the console script starts it (Ctrl-C while the CLI is
still being imported is one line and exit 130, not a KeyboardInterrupt traceback through runpy)."""

from _trainplan_entry import main

raise SystemExit(main())
