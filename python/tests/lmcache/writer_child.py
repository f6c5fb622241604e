"""Child process of test_lmcache_crash.py: an LMCache engine with the plugin that stores sequence
after sequence, never waiting for its puts, and reports on stdout what it submitted ("stored I") and
which sequences contains() sees durable ("durable I"), until it is killed.

Run: python writer_child.py STORE_DIR"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from crash_shape import CHUNK, CHUNKS_PER_SEQUENCE, SEQUENCES, config, kv, metadata, tokens  # noqa: E402
from cpu_connector import CPUKVConnector  # noqa: E402
from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: E402


def main() -> None:
    path = sys.argv[1]
    md = metadata()
    engine = LMCacheEngineBuilder.get_or_create("crash-child", config(path), md, CPUKVConnector(md),
                                                broadcast_fn=lambda t, s: None,
                                                broadcast_object_fn=lambda o, s: o)
    engine.post_init()
    plugin = engine.storage_manager.storage_backends["tutti"]
    print("ready", flush=True)
    keys = {}
    durable = set()
    for i in range(SEQUENCES):
        t = tokens(i)
        keys[i] = [k for _, _, k in engine.token_database.process_tokens(tokens=t)]
        assert len(keys[i]) == CHUNKS_PER_SEQUENCE and CHUNK
        engine.store(t, kvcaches=kv(i))
        print(f"stored {i} pending {plugin.statistics()['pending_puts']}", flush=True)
        for j in range(i + 1):
            if j not in durable and all(plugin.contains(k) for k in keys[j]):
                durable.add(j)
                print(f"durable {j}", flush=True)
    plugin.flush(600)
    print("done", flush=True)


if __name__ == "__main__":
    main()
