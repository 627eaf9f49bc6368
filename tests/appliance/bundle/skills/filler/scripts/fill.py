import sys
import time

case = sys.argv[1]
if case == "hello":
    print("hello from wasm")
elif case == "fill":
    path, mib = sys.argv[2], int(sys.argv[3])
    chunk = b"x" * (1 << 20)
    with open(path, "wb") as f:
        for _ in range(mib):
            f.write(chunk)
            f.flush()
            # Paced (about 100 MiB/s), so that "ended while it writes" is observable: the
            # caps are sampled every 50 ms, and a faster writer overshoots by what it
            # writes in that time (docs/appliance.md).
            time.sleep(0.01)
    print("wrote", mib)
elif case == "spin":
    while True:
        pass
