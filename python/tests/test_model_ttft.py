"""bench/model/ttft.py, the restore-vs-recompute time-to-first-token program, at a tiny shape on the
CPU (2 layers, 256-token prefix in 64-token blocks, 32 new tokens) in its --quick mode, with every
check on: a transformers Llama model built from a config with random weights prefills the prefix,
the KV goes through tutti.KvStore over uring (O_DIRECT files under /var/tmp) and comes back through
the store (checksums verified) and through pread, bit-exact with the prefill's KV, while the
suffix's forward pass waits for each layer; the first token's logits equal the resident KV's bit
for bit and recompute's within the stated tolerance, and the block device (or this process's
block-layer reads) delivered every restored byte. The program's own checks must be able to fail:
with one stored byte flipped on disk the store refuses the block (DATA_LOSS) and pread's copy is
caught by the byte comparison, and the run exits 1; logits that differ fail both logit rules. Bad
options exit 2 before anything runs. On a GPU machine the H200 command of docs/kv-cache.md runs the
same program at full size (cuFile and KvikIO are measured there; here they are reported as not
measured, with the reason)."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SCRIPT = os.path.join(ROOT, "bench", "model", "ttft.py")
TINY = {
    "dtypes": {"bf16": {"bytes": 2, "torch": "bfloat16"}},
    "models": {"tiny-llama": {"layers": 2, "attention_heads": 4, "kv_heads": 2, "head_dim": 64, "hidden_size": 256,
                              "intermediate_size": 512, "vocab_size": 1024, "rope_theta": 10000.0, "dtype": "bf16"}},
}
PREFIXES, SUFFIX, BLOCK, LAYERS = (128, 256), 32, 64, 2
KV_BYTES_PER_TOKEN = LAYERS * 2 * 2 * 64 * 2  # layers x (K, V) x kv_heads x head_dim x bf16


def run_ttft(data_dir, *extra, repeats=None):
    shapes = os.path.join(data_dir, "shapes.json")
    with open(shapes, "w") as f:
        json.dump(TINY, f)
    out = os.path.join(data_dir, "out")
    cmd = [sys.executable, SCRIPT, "--shapes", shapes, "--models", "tiny-llama", "--prefixes",
           ",".join(map(str, PREFIXES)), "--suffix", str(SUFFIX), "--block-tokens", str(BLOCK),
           *(["--repeats", str(repeats)] if repeats else []), "--device", "cpu", "--drop-caches", "off",
           "--queue-depth", "4", "--pread-threads", "2", "--dir", os.path.join(data_dir, "stores"), "--out", out,
           *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    report = None
    if os.path.exists(os.path.join(out, "ttft.json")):
        with open(os.path.join(out, "ttft.json")) as f:
            report = json.load(f)
    return proc, report


def test_tiny_model_restores_bit_exact_and_reports_every_figure(data_dir):
    # --quick: the GPU run's mode (2 repeats unless given), here at the tiny shape. The page cache is
    # not dropped on this shared machine: every reader uses O_DIRECT, and the block device's read
    # counter proves the bytes came from the disk.
    proc, report = run_ttft(data_dir, "--quick")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert report["pass"] and report["failures"] == []
    assert report["config"]["quick"] and report["config"]["repeats"] == 2
    [model] = report["models"]
    assert model["layers"] == LAYERS and model["kv_bytes_per_token"] == KV_BYTES_PER_TOKEN
    for method in ("recompute", "resident", "tutti", "pread"):
        assert model["methods"][method]["measured"]
    for method in ("cufile", "kvikio"):  # GPU-only paths: said why, never silently dropped
        assert not model["methods"][method]["measured"]
        assert "CUDA" in model["methods"][method]["not_measured"]
    assert model["store"]["bytes"] == max(PREFIXES) * KV_BYTES_PER_TOKEN
    # Every read-only descriptor on the store's files is O_DIRECT (the store's own among them).
    readers = [d for d in model["descriptors"] if not d["writable"]]
    assert readers and all(d["o_direct"] for d in readers), model["descriptors"]
    assert any(d["o_direct"] for d in model["descriptors"] if d["writable"])  # the store's O_DIRECT descriptors
    assert [e["prefix_tokens"] for e in model["prefixes"]] == list(PREFIXES)
    for entry in model["prefixes"]:
        prefix = entry["prefix_tokens"]
        kv_bytes = prefix * KV_BYTES_PER_TOKEN
        assert entry["kv_bytes"] == kv_bytes
        runs = entry["runs"]
        counts = {m: sum(r["method"] == m for r in runs) for m in ("recompute", "resident", "tutti", "pread",
                                                                     "disk-qd32")}
        assert counts == {"recompute": 2, "resident": 2, "tutti": 2, "pread": 2, "disk-qd32": 2}
        for r in runs:
            if r["method"] in ("tutti", "pread"):
                assert r["mismatched_blocks"] == 0
                assert r["ttft_s"] > 0 and r["io_s"] > 0 and r["restore_gbps"] > 0
                assert r["restored_bytes"] == kv_bytes
                assert len(r["compute_layers_s"]) == LAYERS - 1
            if r["method"] == "tutti":  # every byte loaded was verified by its XXH3-64
                assert r["verified_bytes"] == r["bytes"] == kv_bytes and r["layer_results"] == LAYERS
            if r["method"] in ("tutti", "pread", "disk-qd32"):
                # The storage delivered the bytes: the block device under the store (machine-wide,
                # others can only add) or at least this process's block-layer reads.
                moved = r["device_read_bytes"] if r["device_read_bytes"] is not None else r["process_read_bytes"]
                assert moved is not None and moved >= kv_bytes, r
            if r["method"] == "disk-qd32":
                assert r["bytes"] == kv_bytes and r["gbps"] > 0
        for method in ("recompute", "resident", "tutti", "pread"):
            stats = entry["ttft_ms"][method]
            assert stats["n"] == 2 and stats["min"] <= stats["median"] <= stats["max"]
        assert entry["ratios"]["recompute/tutti"] > 0 and entry["ratios"]["pread/tutti"] > 0
        assert entry["bytes_moved"]["tutti"]["restored"] == 2 * kv_bytes
        # Both restores hand the model the prefill's bytes, so the first token's logits equal those of
        # the resident KV bit for bit; against recompute they differ only by bf16 rounding of
        # differently shaped products, within the stated tolerance.
        logits = entry["logits_vs_recompute"]
        for method in ("tutti", "pread"):
            assert logits[method].pop("max_abs_diff_vs_resident") == 0.0
            assert logits[method] == logits["resident"]
        assert logits["tutti"]["rel_l2"] <= logits["tutti"]["rel_l2_tolerance"] == 0.2
        assert logits["tutti"]["cosine"] > 0.99 and logits["tutti"]["repeats"] == 2
        assert entry["recompute_prefix_kv_max_abs_diff_vs_stored"] < 0.25
        assert entry["disk_limit_gbps"]["n"] == 2
        assert entry["hidden_io"]["tutti"]["hidden_io_share"]["median"] >= 0
        assert entry["flops_per_kv_byte"] > 0 and entry["pipeline_model"]["compute_total_ms"] > 0
        assert entry["pipeline_model"]["compute_source"] == "resident"
        assert set(entry["projected_ttft_ms"]) == {"14", "56"}
        assert entry["break_even_gbps"] is None or entry["break_even_gbps"] > 0
    assert "checks: PASS" in proc.stdout
    for name in ("ttft.md", "ttft.log"):
        assert os.path.getsize(os.path.join(data_dir, "out", name)) > 0


def test_a_flipped_byte_on_disk_fails_the_run(data_dir):
    proc, report = run_ttft(data_dir, "--inject-damage", "--methods", "tutti,pread", "--no-disk-limit", "--prefixes",
                            "128", repeats=1)
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert not report["pass"]
    failures = "\n".join(report["failures"])
    assert "tutti" in failures and "DataLoss" in failures  # the store refused the block
    assert "pread" in failures and "differ from the prefill's KV" in failures  # the byte comparison caught it
    assert "checks: FAIL" in proc.stdout


@pytest.mark.parametrize("flag, value, message", [
    ("--prefixes", "100", "not a positive multiple of --block-tokens"),
    ("--models", "no-such-model", "known: tiny-llama"),
    ("--methods", "tutti,teleport", "unknown method 'teleport'"),
    ("--queue-depth", "0", "--queue-depth = 0"),
    ("--logit-rtol", "0", "--logit-rtol = 0"),
])
def test_bad_options_exit_2_naming_the_option(data_dir, flag, value, message):
    shapes = os.path.join(data_dir, "shapes.json")
    with open(shapes, "w") as f:
        json.dump(TINY, f)
    args = {"--shapes": shapes, "--models": "tiny-llama", "--prefixes": "128", "--block-tokens": "64",
            "--dir": os.path.join(data_dir, "stores"), "--out": os.path.join(data_dir, "out")}
    args[flag] = value
    cmd = [sys.executable, SCRIPT] + [x for kv in args.items() for x in kv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not os.path.exists(os.path.join(data_dir, "stores"))


def test_the_logit_checks_can_fail():
    """check_logits, fed a restore whose logits are off by one bf16 step and a recompute far away:
    both rules fail, naming the method. (The full runs above show they pass on real logits.)"""
    import torch

    sys.path.insert(0, os.path.dirname(SCRIPT))
    import ttft

    class Ctx:
        args = type("Args", (), {"logit_rtol": 0.05})()
        failures = []

        def fail(self, message):
            self.failures.append(message)

    run = ttft.ModelRun.__new__(ttft.ModelRun)
    run.ctx, run.name, run.torch = Ctx(), "m", torch
    resident = torch.randn(1000)
    run.logits = {(0, 256, "resident"): resident, (0, 256, "tutti"): resident.clone(),
                  (0, 256, "pread"): resident + 2.0**-8, (0, 256, "recompute"): resident + 1.0}
    run.check_logits(256, 0)
    text = "\n".join(run.ctx.failures)
    assert "pread, repeat 0: the first token's logits differ from the resident KV's" in text
    assert "tutti, repeat 0: the first token's logits differ" not in text
    for method in ("resident", "tutti", "pread"):
        assert f"{method}, repeat 0: the first token's logits are" in text and "--logit-rtol 0.05" in text
