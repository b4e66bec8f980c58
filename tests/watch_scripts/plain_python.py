"""Imports nothing stepscope hooks: reads a file repeatedly and burns some CPU for ~1 s."""

import sys
import time

path = sys.argv[1]
end = time.time() + 1.0
n = 0
while time.time() < end:
    with open(path, "rb") as f:
        n += len(f.read())
    n += sum(i for i in range(20_000)) & 1
print("read", n, "bytes")
