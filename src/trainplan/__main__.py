"""`python -m trainplan`: the `trainplan` command."""

from trainplan.cli import main

raise SystemExit(main())
