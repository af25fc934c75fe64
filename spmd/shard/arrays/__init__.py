"""Placed arrays: specs, shardings, the sharded Array, placing values, arrays over processes."""
