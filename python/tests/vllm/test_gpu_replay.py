"""The worker side (tutti.kv_connector, no vLLM) replaying the calls vLLM 0.33.0 made in the CPU run
(data/recorded_calls.json, written by test_connector.py's recording test with TUTTI_WRITE_RECORDING=1):
every restored byte compared, on the CPU here and on CUDA KV tensors on the GPU machine, where vLLM
cannot be installed. On CUDA it also reports how long each wait_for_layer_load took next to each
layer's compute (CUDA events): figures, never asserted."""

import json
import os

import pytest

torch = pytest.importorskip("torch")

import tutti  # noqa: E402

import replay as R  # noqa: E402

RECORDING = os.path.join(os.path.dirname(__file__), "data", "recorded_calls.json")


def devices():
    out = ["cpu"]
    if torch.cuda.is_available() and tutti.build_info()["accelerator"] == "cuda":
        out.append("cuda")
    return out


def expected(recording):
    """(pages a replay compares after loads, distinct blocks saved) in the recording."""
    layers = len(recording["facts"]["layer_names"])
    loads = saves = 0
    seen = set()
    for call in recording["calls"]:
        if call["call"] == "bind":
            loads += sum(len(t["keys"]) for t in call["meta"]["loads"])
            for t in call["meta"]["saves"]:
                seen.update(t["keys"])
    return loads * layers, len(seen)


@pytest.mark.parametrize("device", devices())
def test_vllms_recorded_calls_replay_and_restore_every_byte(data_dir, device):
    recording = R.load(RECORDING)
    pages, saved = expected(recording)
    assert pages > 0 and saved > 0, "the recording has no loads or no saves"
    result = R.replay(recording, os.path.join(data_dir, "kv"), device)
    assert result.loaded_pages_compared == pages
    assert result.saved_blocks == saved


@pytest.mark.skipif("cuda" not in devices(), reason="needs a GPU and the CUDA build of tutti")
def test_layer_wise_overlap_on_the_gpu(data_dir):
    recording = R.load(RECORDING)
    result = R.replay(recording, os.path.join(data_dir, "kv"), "cuda", compute_matmul=4096)
    assert result.load_steps, "the recording has no step with loads"
    for step in result.load_steps:
        waits, computes = step["wait_ms"], step["compute_ms"]
        print(f"blocks {step['blocks']}: step {step['step_ms']:.3f} ms; wait_for_layer_load per layer (ms) "
              + " ".join(f"{w:.3f}" for w in waits) + "; compute per layer (ms) "
              + " ".join(f"{c:.3f}" for c in computes))
        assert len(waits) == len(recording["facts"]["layer_names"])
    out = os.environ.get("TUTTI_REPLAY_JSON")
    if out:
        with open(out, "w") as f:
            json.dump(result.load_steps, f, indent=1)
