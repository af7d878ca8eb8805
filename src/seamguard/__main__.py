"""`python -m seamguard` is the same as the `seamguard` console script."""

from seamguard.cli import main

main()
