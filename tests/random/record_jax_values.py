"""Record JAX's values for the known-answer tests of spmd.random (not part of the suite).

Run with JAX installed (recorded with jax 0.10.2 on CPU, x32, default
jax_threefry_partitionable=True):

    JAX_PLATFORMS=cpu python tests/random/record_jax_values.py > tests/random/jax_values.json
    JAX_PLATFORMS=cpu JAX_ENABLE_X64=1 python tests/random/record_jax_values.py \
        > tests/random/jax_values_x64.json

Each entry: name -> {"dtype": ..., "shape": ..., "values": flat list}.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
from jax import random as jr


def cases():
    out = {}
    for seed in (0, 42, -1, 2**31 - 1):
        k = jr.key(seed)
        out[f"key_data/{seed}"] = jr.key_data(k)
        out[f"split4/{seed}"] = jr.key_data(jr.split(k, 4))
    k = jr.key(42)
    out["split23"] = jr.key_data(jr.split(k, (2, 3)))
    for d in (0, 1, 123456789, 2**32 - 1):
        out[f"fold_in/{d}"] = jr.key_data(jr.fold_in(k, d))
    out["bits_u32_2x3"] = jr.bits(k, (2, 3))
    out["bits_u8_9"] = jr.bits(k, (9,), jnp.uint8)
    out["bits_u16_9"] = jr.bits(k, (9,), jnp.uint16)
    out["uniform_f32_7"] = jr.uniform(k, (7,))
    out["uniform_f32_range"] = jr.uniform(k, (2, 4), minval=-3.0, maxval=5.0)
    out["uniform_f16_6"] = jr.uniform(k, (6,), jnp.float16)
    out["uniform_bf16_6"] = jr.uniform(k, (6,), jnp.bfloat16).astype(jnp.float32)
    out["normal_f32_3x4"] = jr.normal(k, (3, 4))
    out["normal_f32_big"] = jr.normal(jr.key(7), (1000,))
    out["normal_f16_5"] = jr.normal(k, (5,), jnp.float16)
    out["randint_0_10"] = jr.randint(k, (10,), 0, 10)
    out["randint_m5_5"] = jr.randint(k, (2, 5), -5, 5)
    out["randint_u8_0_256"] = jr.randint(k, (8,), 0, 256, jnp.uint8)
    out["randint_big"] = jr.randint(k, (6,), -2**31, 2**31 - 1)
    out["randint_empty"] = jr.randint(k, (4,), 5, 3)
    out["bernoulli_03"] = jr.bernoulli(k, 0.3, (12,))
    out["exponential"] = jr.exponential(k, (6,))
    out["laplace"] = jr.laplace(k, (6,))
    out["logistic"] = jr.logistic(k, (6,))
    out["gumbel"] = jr.gumbel(k, (6,))
    out["rademacher"] = jr.rademacher(k, (10,))
    logits = jnp.log(jnp.array([0.1, 0.2, 0.3, 0.4]))
    out["categorical_1d"] = jr.categorical(k, logits, shape=(12,))
    out["categorical_2d_axis0"] = jr.categorical(k, jnp.arange(12.0).reshape(4, 3) / 4, axis=0)
    out["categorical_noreplace"] = jr.categorical(k, logits, shape=(3,), replace=False)
    out["choice_replace"] = jr.choice(k, 10, (6,))
    out["choice_noreplace"] = jr.choice(k, 10, (6,), replace=False)
    out["choice_p"] = jr.choice(k, 5, (8,), p=jnp.array([0.1, 0.2, 0.3, 0.2, 0.2]))
    out["choice_p_noreplace"] = jr.choice(k, 5, (3,), replace=False,
                                          p=jnp.array([0.1, 0.2, 0.3, 0.2, 0.2]))
    out["choice_array_axis1"] = jr.choice(k, jnp.arange(12).reshape(3, 4), (2,), axis=1)
    out["permutation_10"] = jr.permutation(k, 10)
    out["permutation_2d"] = jr.permutation(k, jnp.arange(12).reshape(4, 3))
    out["permutation_indep"] = jr.permutation(k, jnp.arange(12).reshape(3, 4), axis=1,
                                              independent=True)
    out["truncated_normal"] = jr.truncated_normal(k, -1.0, 2.0, (8,))
    out["legacy_normal"] = jr.normal(jr.PRNGKey(3), (4,))
    out["gamma"] = jr.gamma(k, jnp.array([0.3, 1.0, 2.5, 7.0]), (2, 4))
    out["loggamma"] = jr.loggamma(k, 0.2, (5,))
    out["beta"] = jr.beta(k, 2.0, 3.0, (5,))
    out["dirichlet"] = jr.dirichlet(k, jnp.array([1.0, 2.0, 0.5]), (2,))
    out["poisson_small"] = jr.poisson(k, 3.0, (8,))
    out["poisson_mixed"] = jr.poisson(k, jnp.array([0.0, 0.5, 12.0, 40.0, 200.0]))
    mean = jnp.array([1.0, -1.0, 0.5])
    cov = jnp.array([[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 0.5]])
    out["multivariate_normal"] = jr.multivariate_normal(k, mean, cov, (4,))
    out["orthogonal"] = jr.orthogonal(k, 4)
    out["orthogonal_3x5"] = jr.orthogonal(k, 3, m=5)
    return out


def x64_cases():
    k = jr.key(2**40 + 7)
    return {"x64_key": jr.key_data(k), "x64_key_neg": jr.key_data(jr.key(-3)),
            "x64_bits64": jr.bits(k, (4,), jnp.uint64),
            "x64_uniform64": jr.uniform(k, (4,), jnp.float64),
            "x64_normal64": jr.normal(k, (4,), jnp.float64),
            "x64_randint64": jr.randint(k, (5,), -2**40, 2**40, jnp.int64)}


def erf_inv_inputs(dtype) -> np.ndarray:
    """Arguments of lax.erf_inv: a grid, both ends, the approach to +-1 (the tail
    branch), tiny and subnormal values, and uniform draws."""
    nbits = np.finfo(dtype).nmant + 1
    near_one = 1.0 - 2.0 ** -np.arange(1, nbits + 1, dtype=np.float64)
    tiny = np.array([0.0, 1e-30, np.finfo(dtype).smallest_subnormal, 1e-7, 1e-3])
    draws = np.random.default_rng(0).uniform(-1.0, 1.0, 300)
    x = np.concatenate([np.linspace(-1.0, 1.0, 201), near_one, -near_one, tiny, -tiny, draws])
    return x.astype(dtype)


def erf_inv_cases():
    """lax.erf_inv (XLA's ErfInv32/ErfInv64) on erf_inv_inputs, inputs recorded too."""
    dtype = np.float64 if jax.config.jax_enable_x64 else np.float32
    x = erf_inv_inputs(dtype)
    tag = np.dtype(dtype).name
    return {f"erf_inv_in_{tag}": x, f"erf_inv_{tag}": jax.lax.erf_inv(jnp.asarray(x))}


def main():
    res = {}
    todo = x64_cases() if jax.config.jax_enable_x64 else {**cases(), **initializer_cases()}
    todo.update(erf_inv_cases())
    for name, v in todo.items():
        a = np.asarray(v)
        res[name] = {"dtype": str(a.dtype), "shape": list(a.shape),
                     "values": a.ravel().tolist()}
    res["_provenance"] = {"jax": jax.__version__, "backend": jax.default_backend(),
                          "threefry_partitionable": bool(jax.config.jax_threefry_partitionable)}
    print(json.dumps(res, indent=0))


def initializer_cases():
    from jax.nn import initializers as ji

    k = jr.key(42)
    out = {
        "init_glorot_uniform": ji.glorot_uniform()(k, (4, 3)),
        "init_glorot_normal": ji.glorot_normal()(k, (4, 3)),
        "init_he_uniform": ji.he_uniform()(k, (5, 2)),
        "init_he_normal": ji.he_normal()(k, (5, 2)),
        "init_lecun_uniform": ji.lecun_uniform()(k, (3, 3)),
        "init_lecun_normal": ji.lecun_normal()(k, (2, 3, 4)),
        "init_normal": ji.normal(0.5)(k, (6,)),
        "init_uniform": ji.uniform(2.0)(k, (6,)),
        "init_truncated_normal": ji.truncated_normal(0.3)(k, (6,)),
        "init_variance_scaling_fan_out": ji.variance_scaling(0.7, "fan_out", "normal")(k, (3, 5)),
        "init_variance_scaling_conv": ji.variance_scaling(
            1.0, "fan_geo_avg", "uniform", in_axis=-2, out_axis=-1)(k, (3, 3, 2, 4)),
        "init_orthogonal": ji.orthogonal(1.5)(k, (3, 4)),
        "init_orthogonal_3d": ji.orthogonal(column_axis=0)(k, (2, 3, 2)),
        "init_constant": ji.constant(0.25)(k, (2, 2)),
    }
    return out


if __name__ == "__main__":
    main()
