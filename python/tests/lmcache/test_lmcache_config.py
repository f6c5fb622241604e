"""Every configuration error of tutti.lmcache, each naming its key: through check_config (the validation
entry point, no disk touched), through a real LMCache engine start-up (on_config_error: stop refuses
to start; on_config_error: log is LMCache's own behaviour, the engine starts without the plugin and
logs the message), errors only the disk can tell (ramfs, another configuration's store, a
changed capacity, a second writer, a capacity below one chunk), and the LMCache release check at
import."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from lmcache_harness import engines, lmcache_log, store_dir  # noqa: F401 - fixtures
from lmcache_harness import CHUNK, make_config, make_metadata, plugin_extra

import tutti.lmcache
from tutti.lmcache import ConfigError, StartupRefused, check_config

SEEDLESS = {}  # an environment without PYTHONHASHSEED
HERE = os.path.dirname(os.path.abspath(__file__))


def bad(folder, **settings):
    return make_config(folder, extra=plugin_extra(folder, **settings))


CASES = [
    # (id, config factory(path), metadata overrides, environ, key, words in the message)
    ("unknown setting", lambda p: bad(p, capacity_gib=1), {}, SEEDLESS,
     "storage_plugin.tutti.capacity_gib", "unknown setting"),
    ("path missing", lambda p: bad(p, path=None), {}, SEEDLESS, "storage_plugin.tutti.path", "is required"),
    ("path relative", lambda p: bad(p, path="relative/dir"), {}, SEEDLESS,
     "storage_plugin.tutti.path", "absolute"),
    ("path not a string", lambda p: bad(p, path=7), {}, SEEDLESS, "storage_plugin.tutti.path", "string"),
    ("unknown placeholder", lambda p: bad(p, path=p + "/{node}"), {}, SEEDLESS,
     "storage_plugin.tutti.path", "unknown placeholder {node}"),
    ("malformed template", lambda p: bad(p, path=p + "/{rank"), {}, SEEDLESS,
     "storage_plugin.tutti.path", "not a valid template"),
    ("several ranks, one path", lambda p: bad(p, path=p + "/kv"), {"world_size": 2}, SEEDLESS,
     "storage_plugin.tutti.path", "{rank}"),
    ("capacity missing", lambda p: bad(p, capacity_gb=None), {}, SEEDLESS,
     "storage_plugin.tutti.capacity_gb", "is required"),
    ("capacity zero", lambda p: bad(p, capacity_gb=0), {}, SEEDLESS, "storage_plugin.tutti.capacity_gb", "> 0"),
    ("capacity negative", lambda p: bad(p, capacity_gb=-1.5), {}, SEEDLESS,
     "storage_plugin.tutti.capacity_gb", "> 0"),
    ("capacity a string", lambda p: bad(p, capacity_gb="10"), {}, SEEDLESS,
     "storage_plugin.tutti.capacity_gb", "finite number"),
    ("capacity not finite", lambda p: bad(p, capacity_gb=float("inf")), {}, SEEDLESS,
     "storage_plugin.tutti.capacity_gb", "finite number"),
    ("unknown backend", lambda p: bad(p, backend="spdk"), {}, SEEDLESS,
     "storage_plugin.tutti.backend", "uring, nvme-soft"),
    ("nvme-soft without its image", lambda p: bad(p, backend="nvme-soft"), {}, SEEDLESS,
     "storage_plugin.tutti.nvme_soft.backing_path", "is required"),
    ("nvme-soft without its device", lambda p: bad(p, backend="nvme-soft", **{"nvme_soft.backing_path": "/x"}),
     {}, SEEDLESS, "storage_plugin.tutti.nvme_soft.block_device_path", "is required"),
    ("nvme-soft paths with uring", lambda p: bad(p, **{"nvme_soft.backing_path": "/x"}), {}, SEEDLESS,
     "storage_plugin.tutti.nvme_soft.backing_path", "nvme-soft' only"),
    ("verify_on_load a string", lambda p: bad(p, verify_on_load="yes"), {}, SEEDLESS,
     "storage_plugin.tutti.verify_on_load", "true or false"),
    ("queue depth zero", lambda p: bad(p, queue_depth=0), {}, SEEDLESS,
     "storage_plugin.tutti.queue_depth", "1..32768"),
    ("queue depth too deep", lambda p: bad(p, queue_depth=40000), {}, SEEDLESS,
     "storage_plugin.tutti.queue_depth", "1..32768"),
    ("queue depth a float", lambda p: bad(p, queue_depth=8.5), {}, SEEDLESS,
     "storage_plugin.tutti.queue_depth", "integer"),
    ("io timeout zero", lambda p: bad(p, io_timeout_s=0), {}, SEEDLESS,
     "storage_plugin.tutti.io_timeout_s", "seconds"),
    ("on_config_error unknown", lambda p: bad(p, on_config_error="ignore"), {}, SEEDLESS,
     "storage_plugin.tutti.on_config_error", "'stop'"),
    ("builtin hash without PYTHONHASHSEED",
     lambda p: make_config(p, pre_caching_hash_algorithm="builtin"), {}, SEEDLESS,
     "pre_caching_hash_algorithm", "PYTHONHASHSEED"),
    ("xxhash without PYTHONHASHSEED",
     lambda p: make_config(p, pre_caching_hash_algorithm="xxhash"), {}, {"PYTHONHASHSEED": "random"},
     "pre_caching_hash_algorithm", "sha256_cbor"),
    ("layer-wise chunks", lambda p: make_config(p, use_layerwise=True), {}, SEEDLESS,
     "use_layerwise", "not supported"),
    ("no CPU buffer", lambda p: make_config(p, max_local_cpu_size=0), {}, SEEDLESS,
     "max_local_cpu_size", "> 0"),
    ("not our class", lambda p: make_config(p, extra=plugin_extra(p, class_name="Other")), {}, SEEDLESS,
     "storage_plugins", "TuttiStorageBackend"),
    ("two entries name the plugin",
     lambda p: make_config(p, storage_plugins=["tutti", "tutti2"],
                           extra={**plugin_extra(p), "storage_plugin.tutti2.module_path": "tutti.lmcache",
                                  "storage_plugin.tutti2.class_name": "TuttiStorageBackend"}),
     {}, SEEDLESS, "storage_plugins", "one Tutti store per LMCache engine"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_check_config_names_the_key(store_dir, case):
    _, config, meta, environ, key, words = case
    with pytest.raises(ConfigError) as caught:
        check_config(config(store_dir), make_metadata(**meta), environ=environ)
    assert caught.value.key == key
    assert str(caught.value).startswith(key + " = ")
    assert words in str(caught.value)


def test_check_config_accepts_good_settings(store_dir):
    cfg = make_config(store_dir, extra=plugin_extra(store_dir + "/rank-{rank}-of-{world_size}", queue_depth=64,
                                                    verify_on_load=False, io_timeout_s=5, capacity_gb=2))
    s = check_config(cfg, make_metadata(world_size=4, worker_id=3), environ=SEEDLESS)
    assert s.path == store_dir + "/rank-3-of-4" and s.capacity_bytes == 2 * 1024**3
    assert (s.backend, s.queue_depth, s.verify_on_load, s.io_timeout_s) == ("uring", 64, False, 5.0)
    # an unstable hash is fine once PYTHONHASHSEED pins it; it becomes part of the store's namespace
    s = check_config(make_config(store_dir, pre_caching_hash_algorithm="builtin"), make_metadata(),
                     environ={"PYTHONHASHSEED": "0"})
    assert (s.hash_algorithm, s.hash_seed) == ("builtin", "0")


def test_a_bad_setting_stops_lmcache_start_up(store_dir, engines):
    with pytest.raises(StartupRefused) as caught:
        engines(bad(store_dir, capacity_gb=-1))
    assert "storage_plugin.tutti.capacity_gb = -1" in str(caught.value)
    assert isinstance(caught.value.error, ConfigError) and not isinstance(caught.value, Exception)


def test_on_config_error_log_is_lmcaches_own_behaviour(store_dir, engines, lmcache_log):
    e = engines(bad(store_dir, capacity_gb=-1, on_config_error="log"))
    assert list(e.backends) == ["LocalCPUBackend"]  # LMCache started without the plugin
    assert any(line.startswith("ERROR") and "Failed to create backend tutti" in line
               and "storage_plugin.tutti.capacity_gb = -1" in line for line in lmcache_log), lmcache_log


def start(path, extra=None, **config):
    return make_config(path, extra=extra if extra is not None else plugin_extra(path), **config)


@pytest.fixture
def ramfs():
    """A ramfs mount: no O_DIRECT, and statvfs reports 0 bytes free (tmpfs has O_DIRECT since Linux 6.6)."""
    folder = tempfile.mkdtemp(prefix="tutti-lmcache-ramfs-", dir="/var/tmp")
    mounted = subprocess.run(["mount", "-t", "ramfs", "ramfs", folder], capture_output=True, text=True)
    if mounted.returncode != 0:
        os.rmdir(folder)
        pytest.skip(f"cannot mount ramfs (needs root): {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", folder], check=True)
    os.rmdir(folder)


def test_a_path_on_ramfs_is_refused(ramfs, engines):
    """The store checks the free space before it writes anything: ramfs has none to report, so the
    start-up is refused naming capacity_gb and the bytes needed, and nothing is left behind."""
    path = ramfs + "/kv-{rank}"
    with pytest.raises(StartupRefused) as caught:
        engines(start(ramfs, extra=plugin_extra(path)))
    text = str(caught.value)
    assert "storage_plugin.tutti.capacity_gb = 0.01: RESOURCE_EXHAUSTED" in text and "0 bytes free" in text, text
    assert os.listdir(ramfs) in ([], ["kv-0"]) and not os.path.exists(ramfs + "/kv-0/layer-00000.kv")


def test_a_refused_start_up_ends_the_process(store_dir):
    """LMCache runs its storage manager's event loop in a non-daemon thread started before the
    plugins: a process whose start-up the plugin refuses must still exit, with the message."""
    code = (
        "import sys\n"
        f"sys.path.insert(0, {HERE!r})\n"
        "from lmcache_harness import Engine, make_config, make_metadata, plugin_extra\n"
        f"Engine(make_config({store_dir!r}, extra=plugin_extra({store_dir!r}, capacity_gb=-1)), make_metadata())\n"
        "print('started')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and "started" not in run.stdout
    assert "tutti.lmcache refused to start: storage_plugin.tutti.capacity_gb = -1" in run.stderr


def test_a_store_of_another_configuration_is_refused(store_dir, engines):
    engines(start(store_dir)).close()
    with pytest.raises(StartupRefused) as caught:
        engines(start(store_dir, chunk_size=2 * CHUNK))  # LMCache's chunk_size changed
    text = str(caught.value)
    assert "storage_plugin.tutti.path" in text and "block_tokens: stored 16, requested 32" in text
    with pytest.raises(StartupRefused, match="hash_algorithm"):
        engines(start(store_dir, pre_caching_hash_algorithm="sha256"))
    with pytest.raises(StartupRefused, match="model"):
        engines(start(store_dir), make_metadata(model="another/model"))


def test_a_changed_capacity_is_refused(store_dir, engines):
    engines(start(store_dir)).close()
    with pytest.raises(StartupRefused, match=r"storage_plugin\.tutti\.capacity_gb = 0\.02: .*another capacity"):
        engines(start(store_dir, extra=plugin_extra(store_dir, capacity_gb=0.02)))


def test_a_capacity_below_one_chunk_is_refused(store_dir, engines):
    with pytest.raises(StartupRefused, match=r"capacity_gb = .*holds no chunk: one chunk takes 20480 bytes"):
        engines(start(store_dir, extra=plugin_extra(store_dir, capacity_gb=16384 / 1024**3)))


def test_a_second_writer_is_refused(store_dir, engines):
    engines(start(store_dir))
    with pytest.raises(StartupRefused, match=rf"another process is the writer of {store_dir}.*{os.getpid()}"):
        engines(start(store_dir))


def test_nvme_soft_with_a_missing_image_is_refused(store_dir, engines):
    extra = plugin_extra(store_dir, backend="nvme-soft", **{"nvme_soft.backing_path": store_dir + "/no-image",
                                                            "nvme_soft.block_device_path": "/dev/no-loop"})
    with pytest.raises(StartupRefused, match=r"storage_plugin\.tutti\.backend = 'nvme-soft': the runtime did not"):
        engines(start(store_dir, extra=extra))


def test_the_lmcache_release_is_checked_at_import():
    code = (
        "import importlib.metadata as m\n"
        "real = m.version\n"
        "m.version = lambda name: '0.6.1' if name == 'lmcache' else real(name)\n"
        "import tutti.lmcache\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert ("ImportError: tutti.lmcache supports LMCache 0.5.x (tested with 0.5.6); the installed lmcache is "
            "0.6.1") in run.stderr
    with pytest.raises(ImportError, match="lmcache is not installed"):
        tutti.lmcache._check_lmcache_release(None)
    tutti.lmcache._check_lmcache_release("0.5.0")  # any 0.5.x is accepted
