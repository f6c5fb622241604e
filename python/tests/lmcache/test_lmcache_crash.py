"""A real child process (writer_child.py: an LMCache engine with the plugin, storing sequence after
sequence without waiting) is killed with SIGKILL while its puts are in flight. A new engine on the
same path then serves only complete chunks: every sequence the child saw durable is a full hit, and
every chunk any lookup reports retrieves with exactly the bytes the child stored."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time

import torch

from lmcache_harness import store_dir  # noqa: F401 - fixtures
from lmcache_harness import Engine
import crash_shape
from crash_shape import CHUNK, CHUNKS_PER_SEQUENCE, config, kv, metadata, tokens

HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_writer_killed_in_the_middle_of_puts_leaves_only_complete_chunks(store_dir):
    child = subprocess.Popen([sys.executable, os.path.join(HERE, "writer_child.py"), store_dir],
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1)
    durable, stored, pending_at_kill = set(), -1, 0
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([child.stdout], [], [], 5)
            if not ready:
                assert child.poll() is None, "the child exited before it was killed"
                continue
            line = child.stdout.readline().split()
            assert line and line[0] != "done", "the child finished every put before it was killed"
            if line[0] == "durable":
                durable.add(int(line[1]))
            elif line[0] == "stored":
                stored, pending = int(line[1]), int(line[3])
                if len(durable) >= 5 and pending > 0:
                    pending_at_kill = pending
                    child.send_signal(signal.SIGKILL)  # puts are in flight right now
                    break
        else:
            raise AssertionError("the child made no progress in 600 s")
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL and pending_at_kill > 0

    e = Engine(config(store_dir), metadata())  # a new process's view of the store: reopen after the crash
    try:
        plugin = e.plugin
        assert plugin.statistics()["store"]["dropped_records"] == 0
        full = partial = 0
        for i in range(stored + 2):  # everything submitted, and one past it
            t, expected = tokens(i), kv(i)
            hit = e.lookup(t)
            assert hit % CHUNK == 0
            if i in durable:
                assert hit == len(t), f"sequence {i} was durable before the kill but is gone"
            mask, out = e.retrieve(t, expected)
            assert int(mask.sum()) == hit
            assert torch.equal(out[:, :, :hit], expected[:, :, :hit]), f"sequence {i}: wrong bytes served"
            assert not out[:, :, hit:].any()
            full += hit == len(t)
            partial += 0 < hit < len(t)
        assert full >= len(durable)
        stats = plugin.statistics()
        assert stats["store"]["verification_failures"] == 0  # no torn chunk was ever committed
        print(f"killed with {pending_at_kill} puts pending after {stored + 1} sequences: {full} complete, "
              f"{partial} partial, {len(durable)} seen durable by the child; chunks per sequence "
              f"{CHUNKS_PER_SEQUENCE}, {crash_shape.SEQUENCES} planned")
    finally:
        e.close()
