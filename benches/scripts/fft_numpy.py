# The NumPy side of `kiln bench benches/kir/fft_256x4096.kir` and `rfft_64x1000.kir`
# (docs/performance.md, "fft against NumPy"): median of 20 calls after one warm-up.
import numpy as np, time
def med(f, runs=20):
    f(); ts=[]
    for _ in range(runs):
        t=time.perf_counter(); f(); ts.append(time.perf_counter()-t)
    ts.sort(); return ts[len(ts)//2]*1e3
rng=np.random.default_rng(0)
x=(rng.standard_normal((256,4096))+1j*rng.standard_normal((256,4096))).astype(np.complex64)
r=rng.standard_normal((64,1000)).astype(np.float32)
print("numpy", np.__version__)
print("fft c64[256,4096]: median %.3f ms" % med(lambda: np.fft.fft(x, axis=-1)), np.fft.fft(x).dtype)
print("rfft f32[64,1000]: median %.3f ms" % med(lambda: np.fft.rfft(r, axis=-1)), np.fft.rfft(r).dtype)
