"""Lifetimes and interruptions: a tensor the caller drops while its IO is in flight is kept alive
until the IO is done (never a use after free), and Ctrl-C during a long wait leaves the IO and the
runtime usable. The IO is made slow for real: the soft NVMe controller completes it late."""

import gc
import os
import signal
import threading
import time
import weakref

import numpy as np
import pytest

import tutti
from conftest import needs_root

pytestmark = needs_root


def slow_read(ext4, rt, delay_s, name):
    """A file of known bytes, and a READ of it that the controller completes delay_s late."""
    payload = os.urandom(64 << 10)
    path = os.path.join(ext4.mount_point, name)
    with open(path, "wb") as f:
        f.write(payload)
        os.fsync(f.fileno())
    target = rt.open("file://" + path)
    rt.inject_fault("delay_completion", delay_s=delay_s, max_fires=1)
    return payload, target


def test_array_dropped_while_its_io_is_in_flight_stays_alive_until_done(ext4, nvme_soft):
    payload, target = slow_read(ext4, nvme_soft, 0.5, "dropped")
    buffer = tutti.empty(64 << 10, np.uint8)
    buffer[:] = 0
    alive = weakref.ref(buffer.base)  # the allocation behind the aligned view
    memory = nvme_soft.register(buffer)
    io = nvme_soft.submit([(tutti.READ, memory, 0, target, 0, len(payload))])
    del buffer
    gc.collect()
    assert alive() is not None  # the registration keeps it: the device still writes into it
    assert io.wait(timeout_s=10).ok
    assert memory.obj.tobytes() == payload  # the bytes landed in the very object the caller dropped
    memory.unregister()
    del memory
    gc.collect()
    assert alive() is None  # unregistered and unreferenced: freed


def test_unregister_while_in_flight_is_refused_and_the_memory_stays_registered(ext4, nvme_soft):
    payload, target = slow_read(ext4, nvme_soft, 0.5, "busy")
    memory = nvme_soft.register(tutti.empty(64 << 10, np.uint8))
    io = nvme_soft.submit([(tutti.READ, memory, 0, target, 0, len(payload))])
    with pytest.raises(tutti.Busy, match="in flight"):
        memory.unregister()
    assert memory.registered
    assert io.wait(timeout_s=10).ok
    assert memory.obj.tobytes() == payload
    memory.unregister()
    assert not memory.registered


def test_ctrl_c_during_a_long_wait_leaves_the_runtime_usable(ext4, nvme_soft):
    payload, target = slow_read(ext4, nvme_soft, 2.0, "interrupted")
    buffer = tutti.empty(64 << 10, np.uint8)
    memory = nvme_soft.register(buffer)
    io = nvme_soft.submit([(tutti.READ, memory, 0, target, 0, len(payload))])
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        io.wait(timeout_s=60)
    interrupted_after = time.monotonic() - start
    timer.join()
    assert interrupted_after < 1.5, f"Ctrl-C took {interrupted_after:.2f} s to interrupt the wait"
    assert not io.done()  # still in flight, and still ours to wait for
    assert io.wait(timeout_s=30).ok
    assert buffer.tobytes() == payload
    again = nvme_soft.submit([(tutti.READ, memory, 0, target, 0, 4096)]).wait(timeout_s=10)
    assert again.ok and buffer[:4096].tobytes() == payload[:4096]


def test_runtime_dropped_with_io_in_flight_drains_before_freeing(ext4):
    with open(os.path.join(ext4.mount_point, "drain"), "wb") as f:
        f.write(b"\x5a" * (64 << 10))
        os.fsync(f.fileno())
    rt = tutti.Runtime("nvme-soft", destructor_drain_timeout_s=10.0, **ext4.runtime_options())
    target = rt.open("file://" + os.path.join(ext4.mount_point, "drain"))
    buffer = tutti.empty(64 << 10, np.uint8)
    memory = rt.register(buffer)
    rt.inject_fault("delay_completion", delay_s=0.5, max_fires=1)
    rt.submit([(tutti.READ, memory, 0, target, 0, 64 << 10)])
    start = time.monotonic()
    del rt, memory, target
    gc.collect()
    assert time.monotonic() - start >= 0.3  # the drain waited for the late completion
    assert buffer.tobytes() == b"\x5a" * (64 << 10)
