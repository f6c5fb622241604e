"""Registers the fixtures of lmcache_harness.py (store_dir, engines, lmcache_log) for the LMCache tests."""

from lmcache_harness import engines, lmcache_log, store_dir  # noqa: F401
