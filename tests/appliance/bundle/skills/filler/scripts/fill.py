import sys

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
    print("wrote", mib)
elif case == "spin":
    while True:
        pass
