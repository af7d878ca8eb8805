"""`python -m seamguard` is the same as the `seamguard` console script."""

from seamguard.app.cli import main

main()
