"""Every error class: the mapping of each StatusCode, and each code raised for real by the C++
layer with its message (field, value, limit); misaligned and non-contiguous tensors refused."""

import os

import numpy as np
import pytest
import torch

import tutti
from conftest import make_file, needs_root

CLASSES = {
    tutti.StatusCode.INVALID_ARGUMENT: (tutti.InvalidArgument, ValueError),
    tutti.StatusCode.OUT_OF_RANGE: (tutti.OutOfRange, ValueError),
    tutti.StatusCode.NOT_FOUND: (tutti.NotFound, LookupError),
    tutti.StatusCode.UNSUPPORTED: (tutti.Unsupported, NotImplementedError),
    tutti.StatusCode.NOT_READY: (tutti.NotReady, tutti.Error),
    tutti.StatusCode.BUSY: (tutti.Busy, tutti.Error),
    tutti.StatusCode.RESOURCE_EXHAUSTED: (tutti.ResourceExhausted, tutti.Error),
    tutti.StatusCode.TIMEOUT: (tutti.TimeoutError, TimeoutError),
    tutti.StatusCode.DEVICE_ERROR: (tutti.DeviceError, OSError),
    tutti.StatusCode.DATA_LOSS: (tutti.DataLoss, tutti.Error),
    tutti.StatusCode.INTERNAL: (tutti.InternalError, tutti.Error),
}


def test_every_status_code_has_its_own_error_class():
    assert set(CLASSES) == {c for c in tutti.StatusCode.__members__.values() if c != tutti.StatusCode.OK}
    seen = set()
    for code, (cls, builtin) in CLASSES.items():
        assert tutti.error_class(code) is cls
        assert issubclass(cls, tutti.Error) and issubclass(cls, builtin)
        error = tutti.make_error(code, "field = 3 exceeds the limit of 2")
        assert type(error) is cls and error.code == code
        assert error.message == "field = 3 exceeds the limit of 2"
        assert str(error) == f"{code.name}: field = 3 exceeds the limit of 2"
        seen.add(cls)
    assert len(seen) == len(CLASSES)
    with pytest.raises(tutti.InvalidArgument):
        tutti.error_class(tutti.StatusCode.OK)


@pytest.fixture
def uring(data_dir):
    with tutti.Runtime("uring") as rt:
        yield rt


@pytest.fixture
def file_target(uring, data_dir):
    return uring.open("file://" + make_file(os.path.join(data_dir, "f"), b"\0" * (64 << 10)), writable=True)


def test_misaligned_tensor_is_refused_with_how_to_get_an_aligned_one(uring):
    raw = tutti.empty(8192 + 64, torch.uint8)
    with pytest.raises(tutti.InvalidArgument) as caught:
        uring.register(raw[64:])
    assert caught.value.code == tutti.StatusCode.INVALID_ARGUMENT
    assert "not a multiple of 4096 bytes" in caught.value.message
    assert "tutti.empty(shape, dtype, device)" in caught.value.message


def test_tensors_with_gaps_are_refused_and_permuted_dense_views_accepted(uring):
    with pytest.raises(tutti.InvalidArgument, match=r"strides \(2048, 2\) in elements\) has gaps"):
        uring.register(tutti.empty((8, 2048), np.uint16)[:, ::2])
    with pytest.raises(tutti.InvalidArgument, match="has gaps or overlaps"):
        uring.register(tutti.empty((64, 64), torch.float32)[:, :32])
    # vLLM's per-layer KV cache view (LBNHC: logical (blocks, heads, tokens, 2 x head size), strides
    # (512, 16, 32, 1)) is a permutation of a contiguous buffer: one byte range, registered as is.
    raw = tutti.empty(64 * 16 * 2 * 16, torch.float16)
    view = raw.view(64, 16, 2, 16).permute(0, 2, 1, 3)
    assert view.stride() == (512, 16, 32, 1) and not view.is_contiguous()
    memory = uring.register(view)
    assert memory.address == raw.data_ptr() and memory.size == raw.nbytes


def test_objects_without_an_array_interface_and_read_only_arrays_are_refused(uring):
    with pytest.raises(tutti.InvalidArgument, match="not a writable array"):
        uring.register("not memory")
    frozen = tutti.empty(4096, np.uint8)
    frozen.flags.writeable = False
    with pytest.raises(tutti.InvalidArgument, match="not a writable array"):
        uring.register(frozen)
    with pytest.raises(tutti.InvalidArgument, match="0 elements"):
        uring.register(tutti.empty(0, np.uint8))


def test_out_of_range_rejects_that_request_alone(uring, file_target):
    buffer = tutti.empty(8192, np.uint8)
    memory = uring.register(buffer)
    io = uring.submit([(tutti.READ, memory, 0, file_target, 0, 4096),
                       (tutti.READ, memory, 4096, file_target, 64 << 10, 4096)])
    assert io.accepted == 1 and [r.index for r in io.rejected] == [1]
    with pytest.raises(tutti.OutOfRange, match="reaches past the target size of 65536 bytes") as caught:
        io.wait(timeout_s=10)
    result = caught.value.result  # partial commit stays visible: request 0 moved its bytes
    assert result.requests[0].ok and result.requests[0].bytes == 4096
    assert not result.requests[1].accepted and result.failed == [1]
    assert io.wait(timeout_s=10, check=False) is not None  # the same result again, without raising


def test_unaligned_offset_is_invalid_argument(uring, file_target):
    memory = uring.register(tutti.empty(8192, np.uint8))
    with pytest.raises(tutti.InvalidArgument, match="target_offset = 100 is not a multiple of 4096"):
        uring.submit([(tutti.READ, memory, 0, file_target, 100, 4096)]).wait(timeout_s=5)


def test_write_to_a_read_only_target_is_invalid_argument(uring, data_dir):
    target = uring.open("file://" + make_file(os.path.join(data_dir, "ro"), b"\0" * 4096))
    memory = uring.register(tutti.empty(4096, np.uint8))
    with pytest.raises(tutti.InvalidArgument, match="opened read-only"):
        uring.submit([(tutti.WRITE, memory, 0, target, 0, 4096)]).wait(timeout_s=5)


def test_malformed_request_lists_are_refused_before_anything_runs(uring, file_target):
    memory = uring.register(tutti.empty(4096, np.uint8))
    with pytest.raises(tutti.InvalidArgument, match=r"requests\[0\] is \(1, 2\)"):
        uring.submit([(1, 2)])
    with pytest.raises(tutti.InvalidArgument, match=r"requests\[1\].target is a int"):
        uring.submit([(tutti.READ, memory, 0, file_target, 0, 4096), (tutti.READ, memory, 0, 7, 0, 4096)])
    with pytest.raises(tutti.InvalidArgument, match=r"requests\[0\].length = -1"):
        uring.submit([(tutti.READ, memory, 0, file_target, 0, -1)])


def test_not_found_for_missing_files_and_closed_or_unregistered_objects(uring, file_target, data_dir):
    with pytest.raises(tutti.NotFound):
        uring.open("file://" + os.path.join(data_dir, "nothing-here"))
    memory = uring.register(tutti.empty(4096, np.uint8))
    memory.unregister()
    with pytest.raises(tutti.NotFound, match="already unregistered"):
        memory.unregister()
    with pytest.raises(tutti.NotFound, match="stale"):
        uring.submit([(tutti.READ, memory, 0, file_target, 0, 4096)]).wait(timeout_s=5)
    file_target.close()
    with pytest.raises(tutti.NotFound, match="already closed"):
        file_target.close()


def test_objects_of_another_runtime_are_refused(uring, file_target):
    with tutti.Runtime("memfs") as other:
        foreign = other.register(np.zeros(4096, np.uint8))
        with pytest.raises(tutti.InvalidArgument, match="registered with another Runtime"):
            uring.submit([(tutti.READ, foreign, 0, file_target, 0, 4096)])


def test_resource_exhausted_is_backpressure_and_never_retried():
    with tutti.Runtime("memfs", queue_depth=1) as rt:
        target = rt.open("memfs://f?size=8192", writable=True)
        memory = rt.register(np.zeros(8192, np.uint8))
        io = rt.submit([(tutti.READ, memory, 0, target, 0, 4096), (tutti.READ, memory, 4096, target, 4096, 4096)])
        assert io.accepted == 1
        assert io.rejected[0].status == tutti.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(tutti.ResourceExhausted) as caught:
            io.wait(timeout_s=5)
        assert caught.value.result.requests[1].bytes == 0  # never ran, never silently retried
        again = rt.submit([(tutti.READ, memory, 4096, target, 4096, 4096)]).wait(timeout_s=5)
        assert again.ok  # the caller resubmits it


def test_unsupported_for_streams_and_faults_where_the_build_has_none(uring):
    if tutti.build_info()["accelerator"] == "host":
        with pytest.raises(tutti.Unsupported, match="CUDA profile"):
            uring.register(tutti.empty(4096, np.uint8), stream=0)
    with pytest.raises(tutti.Unsupported, match="only the nvme-soft backend"):
        uring.inject_fault("delay_completion", delay_s=1)


def test_negative_timeouts_are_invalid_argument(uring, file_target):
    memory = uring.register(tutti.empty(4096, np.uint8))
    io = uring.submit([(tutti.READ, memory, 0, file_target, 0, 4096)])
    with pytest.raises(tutti.InvalidArgument, match="timeout_s = -1"):
        io.wait(timeout_s=-1)
    assert io.wait(timeout_s=5).ok


@needs_root
def test_device_error_carries_the_nvme_status(ext4, nvme_soft):
    target = nvme_soft.open("file://" + ext4.create_file("bad-sector", 64 << 10))
    memory = nvme_soft.register(tutti.empty(64 << 10, np.uint8))
    nvme_soft.inject_fault("complete_with_status", nth_command=1, max_fires=1)
    with pytest.raises(tutti.DeviceError) as caught:
        nvme_soft.submit([(tutti.READ, memory, 0, target, 0, 4096)]).wait(timeout_s=10)
    failed = caught.value.result.requests[0]
    assert failed.device_status == (2 << 8 | 0x81)  # SCT 2 (media), SC 0x81 Unrecovered Read Error
    assert failed.bytes == 0
    assert nvme_soft.submit([(tutti.READ, memory, 0, target, 0, 4096)]).wait(timeout_s=10).ok


@needs_root
def test_timeout_leaves_the_io_in_flight_and_a_later_wait_completes_it(ext4, nvme_soft):
    target = nvme_soft.open("file://" + ext4.create_file("slow", 64 << 10))
    memory = nvme_soft.register(tutti.empty(64 << 10, np.uint8))
    nvme_soft.inject_fault("delay_completion", delay_s=1.0, max_fires=1)
    io = nvme_soft.submit([(tutti.READ, memory, 0, target, 0, 4096)])
    with pytest.raises(tutti.TimeoutError, match="stays in flight"):
        io.wait(timeout_s=0.05)
    assert not io.done()
    with pytest.raises(tutti.Busy, match="in flight"):
        memory.unregister()
    assert io.wait(timeout_s=10).ok and io.done()
    memory.unregister()
