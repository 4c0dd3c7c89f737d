"""NumPy's argmax over rows and over columns of an f32[4096, 4096] array (the peer of
benches/kir/argmax_rows.kir and argmax_columns.kir): median milliseconds of 50 runs."""

import time

import numpy as np

x = np.random.default_rng(1).standard_normal((4096, 4096), dtype=np.float32)
for name, axis in [("rows", 1), ("columns", 0)]:
    times = []
    for _ in range(50):
        t = time.perf_counter()
        np.argmax(x, axis=axis)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    print(f"numpy argmax over {name}: median {times[len(times) // 2]:.2f} ms")
