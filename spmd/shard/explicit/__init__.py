"""Explicit sharding: shardings as types, their rules, axis-type modes and the mesh context."""
