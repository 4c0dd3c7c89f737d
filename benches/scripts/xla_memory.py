"""XLA's memory analysis of the MLP train step, for comparison with kiln's memory plan.

The step is the benchmark's mlp_train_step (784-1024-1024-10, ReLU, batch 256, softmax
cross-entropy on integer labels, SGD lr 0.01, parameters donated), written in JAX. Run with the
peers' environment:

    ~/.cache/kiln-peers-venv/bin/python benches/scripts/xla_memory.py

and compare with `cargo xtask dump FILE --stage plan` on kiln's lowering of the same step.
"""
import jax
import jax.numpy as jnp

DIMS = [784, 1024, 1024, 10]
BATCH = 256
LR = 0.01


def loss(params, x, y):
    h = x
    for i, (w, b) in enumerate(params):
        h = h @ w + b
        if i < len(params) - 1:
            h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def step(params, x, y):
    l, g = jax.value_and_grad(loss)(params, x, y)
    return [(w - LR * gw, b - LR * gb) for (w, b), (gw, gb) in zip(params, g)], l


def main():
    params = [
        (jax.ShapeDtypeStruct((a, b), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.float32))
        for a, b in zip(DIMS, DIMS[1:])
    ]
    x = jax.ShapeDtypeStruct((BATCH, DIMS[0]), jnp.float32)
    y = jax.ShapeDtypeStruct((BATCH,), jnp.int32)
    compiled = jax.jit(step, donate_argnums=(0,)).lower(params, x, y).compile()
    m = compiled.memory_analysis()
    print(f"backend            {jax.default_backend()} (jax {jax.__version__})")
    print(f"arguments          {m.argument_size_in_bytes}")
    print(f"outputs            {m.output_size_in_bytes}")
    print(f"aliased (donated)  {m.alias_size_in_bytes}")
    print(f"temporaries        {m.temp_size_in_bytes}")
    print(f"temp + outputs     {m.temp_size_in_bytes + m.output_size_in_bytes}")


if __name__ == "__main__":
    main()
