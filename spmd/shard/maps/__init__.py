"""The per-device maps: shard_map (its rules, arguments, stacked and eager runners), smap and pmap."""
