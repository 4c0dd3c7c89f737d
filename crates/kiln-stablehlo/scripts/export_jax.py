"""Exports small JAX programs as StableHLO text with seeded inputs and JAX's outputs, the test
data of `tests/jax_programs.rs` (`tests/data/jax/<name>/`: `module.mlir`, `in0.npy`, ...,
`out0.npy`, ...). Run by hand, not in CI, when the programs change:

    ~/.cache/kiln/jax-venv/bin/python crates/kiln-stablehlo/scripts/export_jax.py

Written with JAX 0.10.2 (jaxlib 0.10.2, NumPy 2.4.6) on the CPU; the script prints the
version it ran with into each `module.mlir`'s first line. The outputs are what XLA's CPU
backend computed, in f32: the test compares them with kiln under stated tolerances.
"""

import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "data", "jax")
# Source locations name files relative to the repository root, wherever it is checked out.
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "..")) + os.sep


def save(name, f, args, refs=()):
    """Lowers `f` at `args`, runs it, and writes the module, inputs and outputs (and
    `ref0.npy`, ...: reference values of the outputs computed otherwise, when given)."""
    d = os.path.join(OUT, name)
    os.makedirs(d, exist_ok=True)
    for old in os.listdir(d):
        os.remove(os.path.join(d, old))
    flat, _ = jax.tree_util.tree_flatten(args)
    flat = [np.asarray(a) for a in flat]

    def flat_f(*xs):
        tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(args), list(xs))
        outs, _ = jax.tree_util.tree_flatten(f(*tree))
        return outs

    lowered = jax.jit(flat_f).lower(*flat)
    # With debug information: `loc(...)` annotations, as JAX prints them, are part of the test.
    text = lowered.as_text(debug_info=True).replace(ROOT, "")
    outs = [np.asarray(o) for o in jax.jit(flat_f)(*flat)]
    with open(os.path.join(d, "module.mlir"), "w") as fh:
        fh.write(f"// Exported by scripts/export_jax.py with JAX {jax.__version__}.\n")
        fh.write(text)
    for i, a in enumerate(flat):
        np.save(os.path.join(d, f"in{i}.npy"), a)
    for i, o in enumerate(outs):
        np.save(os.path.join(d, f"out{i}.npy"), o)
    for i, r in enumerate(refs):
        np.save(os.path.join(d, f"ref{i}.npy"), np.asarray(r, np.float64))
    size = sum(os.path.getsize(os.path.join(d, p)) for p in os.listdir(d))
    print(f"{name}: {len(flat)} inputs, {len(outs)} outputs, {size} bytes")


def normal(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def mlp_train_step():
    """A 2-layer MLP, softmax cross-entropy, value_and_grad and one Adam update."""
    rng = np.random.default_rng(1)
    n_in, n_hidden, n_out, batch = 12, 16, 5, 8
    params = {
        "w1": normal(rng, n_in, n_hidden, scale=0.3),
        "b1": normal(rng, n_hidden, scale=0.1),
        "w2": normal(rng, n_hidden, n_out, scale=0.3),
        "b2": normal(rng, n_out, scale=0.1),
    }
    m = {k: normal(rng, *v.shape, scale=0.01) for k, v in params.items()}
    v = {k: np.abs(normal(rng, *p.shape, scale=0.01)) for k, p in params.items()}
    step = np.array(3, np.int32)
    x = normal(rng, batch, n_in)
    labels = rng.integers(0, n_out, batch).astype(np.int32)

    def loss(p, x, labels):
        h = jax.nn.relu(x @ p["w1"] + p["b1"])
        logits = h @ p["w2"] + p["b2"]
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, labels[:, None], axis=1))

    def train_step(p, m, v, step, x, labels):
        lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-8
        l, g = jax.value_and_grad(loss)(p, x, labels)
        t = (step + 1).astype(jnp.float32)
        m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
        v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
        p = jax.tree_util.tree_map(
            lambda p, m, v: p - lr * (m / (1 - b1**t)) / (jnp.sqrt(v / (1 - b2**t)) + eps),
            p, m, v,
        )
        return p, m, v, step + 1, l

    save("mlp_train_step", train_step, (params, m, v, step, x, labels))


def cnn_grad():
    """A small CNN (NHWC convolution, relu, max and average pooling by reduce_window, dense):
    the loss and its gradient with respect to the parameters."""
    rng = np.random.default_rng(2)
    params = {
        "k1": normal(rng, 3, 3, 3, 4, scale=0.3),
        "c1": normal(rng, 4, scale=0.1),
        "k2": normal(rng, 3, 3, 4, 6, scale=0.3),
        "w": normal(rng, 2 * 2 * 6, 3, scale=0.3),
        "b": normal(rng, 3, scale=0.1),
    }
    x = normal(rng, 2, 8, 8, 3)
    y = normal(rng, 2, 3)

    def conv(x, k, stride):
        return jax.lax.conv_general_dilated(
            x, k, (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    def loss(p, x, y):
        h = jax.nn.relu(conv(x, p["k1"], 1) + p["c1"])
        h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jnp.tanh(conv(h, p["k2"], 1))
        h = jax.lax.reduce_window(h, 0.0, jax.lax.add, (1, 2, 2, 1), (1, 2, 2, 1), "VALID") / 4.0
        out = h.reshape(h.shape[0], -1) @ p["w"] + p["b"]
        return jnp.mean((out - y) ** 2)

    def f(p, x, y):
        return jax.value_and_grad(loss)(p, x, y)

    save("cnn_grad", f, (params, x, y))


def transformer_block_grad():
    """One pre-LN transformer block (layer norm, causal multi-head attention with softmax,
    GELU MLP, residuals): a loss of its output and the gradient with respect to the
    parameters."""
    rng = np.random.default_rng(3)
    batch, seq, d, heads, hidden = 2, 6, 8, 2, 16
    params = {
        "ln1_g": 1.0 + normal(rng, d, scale=0.1),
        "ln1_b": normal(rng, d, scale=0.1),
        "wqkv": normal(rng, d, 3 * d, scale=0.3),
        "wo": normal(rng, d, d, scale=0.3),
        "ln2_g": 1.0 + normal(rng, d, scale=0.1),
        "ln2_b": normal(rng, d, scale=0.1),
        "w1": normal(rng, d, hidden, scale=0.3),
        "b1": normal(rng, hidden, scale=0.1),
        "w2": normal(rng, hidden, d, scale=0.3),
        "b2": normal(rng, d, scale=0.1),
    }
    x = normal(rng, batch, seq, d)

    def layer_norm(x, g, b):
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, -1, keepdims=True)
        return (x - mu) * jax.lax.rsqrt(var + 1e-5) * g + b

    def block(p, x):
        h = layer_norm(x, p["ln1_g"], p["ln1_b"])
        q, k, v = jnp.split(h @ p["wqkv"], 3, axis=-1)
        split = lambda t: t.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3)
        q, k, v = split(q), split(k), split(v)
        s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(d // heads).astype(np.float32)
        mask = jnp.tril(jnp.ones((seq, seq), bool))
        s = jnp.where(mask, s, -1e9)
        a = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqk,bhkd->bhqd", a, v).transpose(0, 2, 1, 3).reshape(batch, seq, d)
        x = x + o @ p["wo"]
        h = layer_norm(x, p["ln2_g"], p["ln2_b"])
        h = jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=False)
        return x + h @ p["w2"] + p["b2"]

    def loss(p, x):
        return jnp.mean(block(p, x) ** 2)

    def f(p, x):
        return jax.value_and_grad(loss)(p, x)

    save("transformer_block_grad", f, (params, x))


def threefry_bits():
    """`jax.random` with the default threefry2x32 generator, from a key given as input."""
    key = np.asarray(jax.random.key_data(jax.random.key(20240917)))

    def f(key):
        k = jax.random.wrap_key_data(key)
        k1, k2, k3 = jax.random.split(k, 3)
        return (
            jax.random.bits(k1, (4, 8), jnp.uint32),
            jax.random.uniform(k2, (32,), jnp.float32, -1.0, 2.0),
            jax.random.normal(k3, (2, 16), jnp.float32),
        )

    save("threefry_bits", f, (key,))


def threefry_bits_x64():
    """`jax.random` with 64-bit types (`jax_enable_x64`): `ui64` bits, f64 `uniform` (bits
    shifted into a mantissa and bitcast) and f64 `normal` (through f64 `erf_inv`)."""
    jax.config.update("jax_enable_x64", True)
    try:
        key = np.asarray(jax.random.key_data(jax.random.key(77)))

        def f(key):
            k = jax.random.wrap_key_data(key)
            k1, k2, k3 = jax.random.split(k, 3)
            return (
                jax.random.bits(k1, (16,), jnp.uint64),
                jax.random.uniform(k2, (16,), jnp.float64),
                jax.random.normal(k3, (16,), jnp.float64),
            )

        save("threefry_bits_x64", f, (key,))
    finally:
        jax.config.update("jax_enable_x64", False)


def special_functions():
    """The `chlo` special functions as JAX emits them (erfc, lgamma, digamma, polygamma,
    zeta, bessel_i1e, next_after, top_k), in f32, with SciPy's values in f64 of the same
    inputs as references (`ref*.npy`, one per float output but next_after and top_k)."""
    import scipy.special as sp

    rng = np.random.default_rng(5)
    f32 = np.float32
    erfc_x = np.concatenate([np.linspace(-4, 1.4, 24), np.linspace(1.5, 9.5, 40)]).astype(f32)
    neg = -np.arange(0, 6) - rng.uniform(0.05, 0.95, 6)
    gam_x = np.concatenate(
        [neg, rng.uniform(0.01, 2.5, 24), rng.uniform(2.5, 12, 18), rng.uniform(12, 1e4, 16)]
    ).astype(f32)
    pg_n = np.repeat(np.arange(0, 4), 12).astype(np.int32)
    pg_x = np.tile(np.concatenate([rng.uniform(0.1, 3, 8), rng.uniform(3, 40, 4)]), 4).astype(f32)
    z_s = rng.uniform(1.1, 12, 48).astype(f32)
    z_q = np.concatenate([rng.uniform(0.05, 1, 16), rng.uniform(1, 30, 24), rng.uniform(-0.95, -0.05, 8)]).astype(f32)
    z_s[-8:] = np.round(z_s[-8:])  # q < 0 takes integer s
    i1_x = np.concatenate([np.linspace(-45, 45, 61), [0.0, 29.9, 30.1]]).astype(f32)
    na_x = np.array([1.0, 1.0, -1.0, 0.0, 0.0, 3.4e38, np.inf, 1e-45, -2.5, 7.0], f32)
    na_y = np.array([2.0, 0.0, -2.0, 1.0, -1.0, np.inf, 0.0, 0.0, 10.0, 7.0], f32)
    tk = rng.integers(0, 6, (4, 10)).astype(f32)

    def f(erfc_x, gam_x, pg_n, pg_x, z_s, z_q, i1_x, na_x, na_y, tk):
        jsp = jax.scipy.special
        vals, idx = jax.lax.top_k(tk, 3)
        return (
            jax.lax.erfc(erfc_x),
            jax.lax.lgamma(gam_x),
            jax.lax.digamma(gam_x),
            jsp.polygamma(pg_n, pg_x),
            jsp.zeta(z_s, z_q),
            jsp.i1e(i1_x),
            jnp.nextafter(na_x, na_y),
            vals,
            idx,
        )

    d = lambda a: np.asarray(a, np.float64)
    refs = (
        sp.erfc(d(erfc_x)),
        sp.gammaln(d(gam_x)),
        sp.psi(d(gam_x)),
        sp.polygamma(d(pg_n).astype(int), d(pg_x)),
        sp.zeta(d(z_s), d(z_q)),
        sp.i1e(d(i1_x)),
    )
    save("special_functions", f, (erfc_x, gam_x, pg_n, pg_x, z_s, z_q, i1_x, na_x, na_y, tk), refs)


def special_sweep():
    """Dense f64 sweeps of the special functions with SciPy's values (no JAX program):
    `tests/data/jax/special_sweep/<function>.npy`, each an array of rows (inputs..., value)."""
    import scipy.special as sp

    d = os.path.join(OUT, "special_sweep")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(6)

    def mix(*parts):
        return np.concatenate(parts).astype(np.float64)

    # Up to 26: beyond, erfc is below the normal f64 range (SciPy gives 0 from 26.55).
    x_erfc = mix(np.linspace(-6, 26, 700), rng.uniform(1.3, 1.7, 100))
    x_gam = mix(
        rng.uniform(-30, 0.5, 300),
        rng.uniform(0.5, 3, 300),
        rng.uniform(3, 40, 200),
        10 ** rng.uniform(1.5, 300, 100),
        [1.0, 2.0, 0.5, 1.4616321449683622],
    )
    n_pg = np.repeat(np.arange(0, 6), 120).astype(np.float64)
    x_pg = np.tile(mix(rng.uniform(0.05, 3, 80), rng.uniform(3, 100, 40)), 6)
    s_z = mix(rng.uniform(1.01, 3, 300), rng.uniform(3, 60, 200), np.round(rng.uniform(2, 12, 100)))
    q_z = mix(rng.uniform(0.01, 2, 300), rng.uniform(2, 200, 200), rng.uniform(-0.99, -0.01, 100))
    x_i1 = mix(np.linspace(-80, 80, 801), rng.uniform(28, 32, 100), 10 ** rng.uniform(2, 300, 50))
    y_ei = mix(
        np.linspace(-0.999, 0.999, 500),
        1 - 10 ** rng.uniform(-15.9, -3, 200),
        -(1 - 10 ** rng.uniform(-15.9, -3, 100)),
        10 ** rng.uniform(-300, -3, 50),
    )
    tables = {
        "erf_inv": [y_ei, sp.erfinv(y_ei)],
        "erfc": [x_erfc, sp.erfc(x_erfc)],
        "lgamma": [x_gam, sp.gammaln(x_gam)],
        "digamma": [x_gam, sp.psi(x_gam)],
        "polygamma": [n_pg, x_pg, sp.polygamma(n_pg.astype(int), x_pg)],
        "zeta": [s_z, q_z, sp.zeta(s_z, q_z)],
        "bessel_i1e": [x_i1, sp.i1e(x_i1)],
    }
    for name, cols in tables.items():
        np.save(os.path.join(d, f"{name}.npy"), np.stack(cols, axis=1))
    print("special_sweep:", {k: len(v[0]) for k, v in tables.items()})


def main():
    names = sys.argv[1:] or [
        "mlp_train_step",
        "cnn_grad",
        "transformer_block_grad",
        "threefry_bits",
        "threefry_bits_x64",
        "special_functions",
        "special_sweep",
    ]
    for n in names:
        globals()[n]()


if __name__ == "__main__":
    main()
