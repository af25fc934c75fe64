"""Record JAX's values for the known-answer tests of spmd.random (not part of the suite).

Run with JAX installed (recorded with jax 0.10.2 on CPU, x32, default
jax_threefry_partitionable=True):

    JAX_PLATFORMS=cpu python tests/random/record_jax_values.py > tests/random/jax_values.json

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
    return out


def main():
    res = {}
    for name, v in cases().items():
        a = np.asarray(v)
        res[name] = {"dtype": str(a.dtype), "shape": list(a.shape),
                     "values": a.ravel().tolist()}
    res["_provenance"] = {"jax": jax.__version__, "backend": jax.default_backend(),
                          "threefry_partitionable": bool(jax.config.jax_threefry_partitionable)}
    print(json.dumps(res, indent=0))


if __name__ == "__main__":
    main()
