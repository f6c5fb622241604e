"""bench/model/ttft.py, the restore-vs-recompute time-to-first-token program, at a tiny shape on the
CPU (2 layers, 256-token prefix in 64-token blocks, 32 new tokens), with every check on: a
transformers Llama model built from a config with random weights prefills the prefix, the KV goes
through tutti.KvStore over uring (O_DIRECT files under /var/tmp) and comes back through the store
(checksums verified) and through pread, bit-exact with the prefill's KV, while the suffix's forward
pass waits for each layer. The program's own checks must be able to fail: with one stored byte
flipped on disk the store refuses the block (DATA_LOSS) and pread's copy is caught by the byte
comparison, and the run exits 1. Bad options exit 2 before anything runs. On a GPU machine the H200
command of docs/kv-cache.md runs the same program at full size (cuFile and KvikIO are measured
there; here they are reported as not measured, with the reason)."""

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


def run_ttft(data_dir, *extra, repeats=2):
    shapes = os.path.join(data_dir, "shapes.json")
    with open(shapes, "w") as f:
        json.dump(TINY, f)
    out = os.path.join(data_dir, "out")
    cmd = [sys.executable, SCRIPT, "--shapes", shapes, "--models", "tiny-llama", "--prefixes",
           ",".join(map(str, PREFIXES)), "--suffix", str(SUFFIX), "--block-tokens", str(BLOCK), "--repeats",
           str(repeats), "--device", "cpu", "--drop-caches", "off", "--queue-depth", "4", "--pread-threads", "2",
           "--dir", os.path.join(data_dir, "stores"), "--out", out, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    report = None
    if os.path.exists(os.path.join(out, "ttft.json")):
        with open(os.path.join(out, "ttft.json")) as f:
            report = json.load(f)
    return proc, report


def test_tiny_model_restores_bit_exact_and_reports_every_figure(data_dir):
    proc, report = run_ttft(data_dir)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert report["pass"] and report["failures"] == []
    [model] = report["models"]
    assert model["layers"] == LAYERS and model["kv_bytes_per_token"] == KV_BYTES_PER_TOKEN
    assert model["methods"]["tutti"]["measured"] and model["methods"]["pread"]["measured"]
    for method in ("cufile", "kvikio"):  # GPU-only paths: said why, never silently dropped
        assert not model["methods"][method]["measured"]
        assert "CUDA" in model["methods"][method]["not_measured"]
    assert model["store"]["bytes"] == max(PREFIXES) * KV_BYTES_PER_TOKEN
    assert [e["prefix_tokens"] for e in model["prefixes"]] == list(PREFIXES)
    for entry in model["prefixes"]:
        prefix = entry["prefix_tokens"]
        kv_bytes = prefix * KV_BYTES_PER_TOKEN
        assert entry["kv_bytes"] == kv_bytes
        runs = entry["runs"]
        counts = {m: sum(r["method"] == m for r in runs) for m in ("recompute", "tutti", "pread", "disk-qd32")}
        assert counts == {"recompute": 2, "tutti": 2, "pread": 2, "disk-qd32": 2}
        for r in runs:
            if r["method"] in ("tutti", "pread"):
                assert r["mismatched_blocks"] == 0
                assert r["ttft_s"] > 0 and r["io_s"] > 0 and r["restore_gbps"] > 0
                assert len(r["compute_layers_s"]) == LAYERS - 1
            if r["method"] == "tutti":  # every byte loaded was verified by its XXH3-64
                assert r["verified_bytes"] == r["bytes"] == kv_bytes and r["layer_results"] == LAYERS
            if r["method"] == "disk-qd32":
                assert r["bytes"] == kv_bytes and r["gbps"] > 0
        for method in ("recompute", "tutti", "pread"):
            stats = entry["ttft_ms"][method]
            assert stats["n"] == 2 and stats["min"] <= stats["median"] <= stats["max"]
        assert entry["ratios"]["recompute/tutti"] > 0 and entry["ratios"]["pread/tutti"] > 0
        # Both restores hand the model the same bytes, so the first token's logits are identical;
        # against recompute they differ only by bf16 rounding of differently shaped products.
        logits = entry["logits_vs_recompute"]
        assert logits["pread"].pop("max_abs_diff_vs_tutti") == 0.0
        assert logits["tutti"] == logits["pread"]
        assert 0 <= logits["tutti"]["max_abs_diff"] < 0.25, logits
        assert entry["recompute_prefix_kv_max_abs_diff_vs_stored"] < 0.25
        assert entry["disk_limit_gbps"]["n"] == 2
        assert entry["hidden_io"]["tutti"]["hidden_io_share"]["median"] >= 0
        assert entry["flops_per_kv_byte"] > 0 and entry["pipeline_model"]["compute_total_ms"] > 0
        assert set(entry["projected_ttft_ms"]) == {"14", "56"}
        assert entry["break_even_gbps"] is None or entry["break_even_gbps"] > 0
    assert "checks: PASS" in proc.stdout


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
