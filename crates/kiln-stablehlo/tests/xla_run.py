"""Runs exported StableHLO programs through XLA (CPU) with JAX, for kiln's XLA check.

Usage: xla_run.py DIR. DIR/programs.txt names one program directory per line; each holds
`model.mlir`, its inputs `in0.npy`, `in1.npy`, ... and `dtypes.txt` (the kiln dtype of each
input, one a line; bf16 arrays are stored as their uint16 bits, i4, u4, i2, u2 ones as int8 or
uint8, the small floats (f8e4m3fn, ...) as their bit patterns in uint8). For each program this
writes `out0.npy`, ... (bf16 outputs as uint16 bits, the sub-byte integers widened to int8 or
uint8, the small floats as uint8 bit patterns), or `error.txt` when XLA refuses or fails it.
One process runs them all (JAX starts slowly), and another after any program that aborts XLA.
"""

import os
import sys
import traceback

import jax

jax.config.update("jax_enable_x64", True)

import ml_dtypes  # noqa: E402 (installed with jax)
import numpy as np  # noqa: E402
from jax._src import xla_bridge  # noqa: E402
from jax._src.lib import xla_client as xc  # noqa: E402

# kiln's sub-byte integers, which travel as int8 / uint8 arrays.
SUB_BYTE = {
    "i4": ml_dtypes.int4,
    "u4": ml_dtypes.uint4,
    "i2": ml_dtypes.int2,
    "u2": ml_dtypes.uint2,
}

# kiln's small floats (named as ml_dtypes names them, less `float`), as uint8 bit patterns.
SMALL_FLOATS = {
    n: getattr(ml_dtypes, "float" + n[1] + "_" + n[2:])
    for n in [
        "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e3m4", "f8e4m3fnuz", "f8e5m2fnuz",
        "f8e4m3b11fnuz", "f8e8m0fnu", "f6e2m3fn", "f6e3m2fn", "f4e2m1fn",
    ]
}


def run_one(backend, dev, d):
    with open(os.path.join(d, "model.mlir")) as f:
        text = f.read()
    with open(os.path.join(d, "dtypes.txt")) as f:
        dtypes = [l.strip() for l in f if l.strip()]
    args = []
    for i, dt in enumerate(dtypes):
        a = np.load(os.path.join(d, f"in{i}.npy"))
        if dt == "bf16":
            a = a.view(ml_dtypes.bfloat16)
        elif dt in SUB_BYTE:
            a = a.astype(SUB_BYTE[dt])
        elif dt in SMALL_FLOATS:
            a = a.view(SMALL_FLOATS[dt])
        args.append(jax.device_put(a, dev))
    exe = backend.compile_and_load(text, xc.DeviceList((dev,)), xc.CompileOptions())
    outs = exe.execute(args)
    for i, o in enumerate(outs):
        a = np.asarray(o)
        if a.dtype == ml_dtypes.bfloat16:
            a = a.view(np.uint16)
        elif a.dtype in (ml_dtypes.int4, ml_dtypes.int2):
            a = a.astype(np.int8)
        elif a.dtype in (ml_dtypes.uint4, ml_dtypes.uint2):
            a = a.astype(np.uint8)
        elif a.dtype in SMALL_FLOATS.values():
            a = a.view(np.uint8)
        np.save(os.path.join(d, f"out{i}.npy"), a)


def programs(root):
    with open(os.path.join(root, "programs.txt")) as f:
        return [l.strip() for l in f if l.strip()]


def child(root, start):
    """Runs the programs from index `start` on, writing each one's index to `current.txt`
    before it runs (so that the parent can tell which one took the process down)."""
    backend = xla_bridge.get_backend("cpu")
    dev = backend.devices()[0]
    dirs = programs(root)
    failed = 0
    for k in range(start, len(dirs)):
        with open(os.path.join(root, "current.txt"), "w") as f:
            f.write(str(k))
        d = os.path.join(root, dirs[k])
        try:
            run_one(backend, dev, d)
        except Exception:
            failed += 1
            with open(os.path.join(d, "error.txt"), "w") as f:
                f.write(traceback.format_exc(limit=2))
    with open(os.path.join(root, "current.txt"), "w") as f:
        f.write(str(len(dirs)))
    print(f"xla_run: {len(dirs) - start - failed} of {len(dirs) - start} programs ran on XLA {jax.__version__}")


def main():
    """Runs the programs in child processes: when XLA aborts on one (a failed check inside its
    compiler takes the whole process down), that program gets an `error.txt` saying so and a
    new child goes on from the next."""
    import subprocess

    root = sys.argv[1]
    n = len(programs(root))
    start, aborted = 0, 0
    while start < n:
        p = subprocess.run(
            [sys.executable, __file__, "--child", root, str(start)],
            stderr=subprocess.PIPE,
            text=True,
        )
        with open(os.path.join(root, "current.txt")) as f:
            k = int(f.read())
        if p.returncode == 0 and k >= n:
            break
        if k < start or k >= n:
            sys.stderr.write(p.stderr)
            sys.exit(f"xla_run: the child failed before it ran a program (exit {p.returncode})")
        aborted += 1
        with open(os.path.join(root, programs(root)[k], "error.txt"), "w") as f:
            tail = "\n".join(p.stderr.strip().splitlines()[:3])
            f.write(f"XLA aborted (exit {p.returncode}): {tail}")
        start = k + 1
    print(f"xla_run: {aborted} programs aborted XLA")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], int(sys.argv[3]))
    else:
        main()
