"""A scratch ext4 file system on a loop device, for the nvme-soft backend (needs root).

nvme-soft resolves files to LBAs with FIEMAP and reads and writes them as NVMe commands on a soft
controller backed by the file system's image, so it needs an image, a loop device and a mount.
ScratchExt4 makes all three in a fresh temporary folder and removes them on exit:

    from tutti.scratch import ScratchExt4
    with ScratchExt4(size_bytes=256 << 20) as fs, tutti.Runtime("nvme-soft", **fs.runtime_options()) as rt:
        path = fs.create_file("layer-0.kv", 1 << 20)      # written full size: no unwritten extents
        target = rt.open("file://" + path, writable=True)

Uses truncate, mkfs.ext4 (e2fsprogs), losetup and mount (util-linux). Errors: tutti.Unsupported when
not root, tutti.InternalError naming the command and its output when a command fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from ._tutti import StatusCode, make_error


def _run(*command: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise make_error(
            StatusCode.INTERNAL,
            f"command failed (status {done.returncode}): {' '.join(command)}: {done.stderr.strip()}"
        )
    return done.stdout.strip()


class ScratchExt4:
    """An ext4 image of `size_bytes` bytes (block size `block_size`), on a loop device whose logical
    block size is `sector_size` bytes, mounted at `mount_point` (a fresh folder under `parent`, the
    system's temporary folder by default). Attributes: root, image_path, loop_device, mount_point."""

    def __init__(self, size_bytes: int = 256 << 20, *, block_size: int = 4096, sector_size: int = 512,
                 parent: str | None = None):
        self.size_bytes = size_bytes
        self.block_size = block_size
        self.sector_size = sector_size
        self.parent = parent
        self.root = self.image_path = self.loop_device = self.mount_point = None
        self._mounted = False

    def __enter__(self) -> "ScratchExt4":
        if os.geteuid() != 0:
            raise make_error(StatusCode.UNSUPPORTED, "ScratchExt4 needs root (losetup and mount)")
        self.root = tempfile.mkdtemp(prefix="tutti-fs-", dir=self.parent)
        try:
            self.image_path = os.path.join(self.root, "disk.img")
            self.mount_point = os.path.join(self.root, "mnt")
            os.mkdir(self.mount_point)
            _run("truncate", "-s", str(self.size_bytes), self.image_path)
            _run("mkfs.ext4", "-q", "-F", "-b", str(self.block_size), "-E",
                 "lazy_itable_init=0,lazy_journal_init=0", self.image_path)
            self.loop_device = _run("losetup", "--find", "--show", "--sector-size", str(self.sector_size),
                                    self.image_path)
            _run("mount", self.loop_device, self.mount_point)
            self._mounted = True
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> bool:
        if self._mounted:
            _run("umount", self.mount_point)
            self._mounted = False
        if self.loop_device:
            _run("losetup", "-d", self.loop_device)
            self.loop_device = None
        if self.root:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
        return False

    def runtime_options(self) -> dict:
        """The options Runtime('nvme-soft', ...) needs: backing_path and block_device_path."""
        return {"backing_path": self.image_path, "block_device_path": self.loop_device}

    def create_file(self, name: str, size_bytes: int, fill: bytes = b"\0") -> str:
        """Creates mount_point/name with size_bytes bytes written through write(2) (every extent
        written, as nvme-soft requires), fsyncs it and returns its path."""
        path = os.path.join(self.mount_point, name)
        chunk = (fill * (1 << 20))[: 1 << 20] if fill else b"\0" * (1 << 20)
        with open(path, "wb") as f:
            left = size_bytes
            while left:
                n = min(left, len(chunk))
                f.write(chunk[:n])
                left -= n
            f.flush()
            os.fsync(f.fileno())
        return path

    def drop_caches(self) -> None:
        """sync, then drop the page cache (echo 3 > /proc/sys/vm/drop_caches)."""
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
