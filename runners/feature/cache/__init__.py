"""Feature cache levels of the FeatureRunner: L1 (process LRU) -> L2 (Redis) -> origin (mmap).

``build_feature_store(cache, redis, features, snapshot_version)`` (the two settings sections) is the
entry point; see
``tiered.py`` for the read path and ``l2_redis.py`` for the Redis key layout.
"""

from .l1 import L1Cache
from .l2_redis import RedisFeatureLevel
from .origin import OriginLevel
from .tiered import FetchStats, TieredFeatureStore, build_feature_store

__all__ = [
    "FetchStats",
    "L1Cache",
    "OriginLevel",
    "RedisFeatureLevel",
    "TieredFeatureStore",
    "build_feature_store",
]
