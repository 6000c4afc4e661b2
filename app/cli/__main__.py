"""`python -m app.cli ...`: the same as the `microscheduler` command."""

from app.cli import main

main()
