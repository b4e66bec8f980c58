"""Exits with code 3 after a little work."""

import sys

total = sum(i * i for i in range(10_000))
print("about to fail", total)
sys.exit(3)
