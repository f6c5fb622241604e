#!/usr/bin/env python3
"""How much the first token's logits of bench/model/ttft.py's model move when the restored KV is
wrong in a given way, on the CPU: the sensitivity behind ttft.py's --logit-rtol rule
(docs/kv-cache.md, "Checks").

    python bench/model/logit_sensitivity.py LAYERS PREFIX_TOKENS    # e.g. 4 384

The 8B shape of data/model_shapes.json with LAYERS layers and a 32000-token vocabulary (to fit the
CPU), random weights, bf16; blocks of 64 tokens, 64 new tokens. Prints the relative L2 distance
(||a - b||_2 / ||b||_2) of the first token's logits from those with the prefill's own KV resident,
for: recompute (one prefill of prefix + new tokens), one-bf16-step changes on 10 % and 50 % of the
finite non-zero KV values, the prefix's blocks shuffled, and the layers' KV in reverse order.
"""

import json
import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import kvmodel  # noqa: E402


def main(layers: int, prefix: int) -> None:
    torch.set_grad_enabled(False)
    with open(os.path.join(HERE, "..", "..", "data", "model_shapes.json")) as f:
        shape = dict(json.load(f)["models"]["llama-3-8b"], vocab_size=32000)
    new, bt = 64, 64
    if prefix <= 0 or prefix % bt:
        sys.exit(f"logit_sensitivity: PREFIX_TOKENS = {prefix}: not a positive multiple of {bt}")
    t = time.time()
    model, _ = kvmodel.build_model(shape, layers, prefix + new, torch.device("cpu"), torch.bfloat16, 0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape["vocab_size"], (prefix + new,), generator=g)
    out = kvmodel.first_token(model, ids[:prefix], 0, None, None)
    nb = prefix // bt
    ref = []
    for layer in range(layers):
        cached = out["cache"].layers[layer]
        blocks = torch.empty((nb, 2, shape["kv_heads"], bt, shape["head_dim"]), dtype=torch.bfloat16)
        kvmodel.blockify_into(blocks, cached.keys, cached.values, bt)
        ref.append(blocks)

    def suffix(kv):
        gate = kvmodel.LayerGate(lambda layer: None, layers, kvmodel.Marks(None))
        return kvmodel.first_token(model, ids[prefix:], prefix, kvmodel.restoring_cache(layers, kv, nb, gate),
                                   None)["logits"]

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    base = suffix(ref)
    print(f"logits' RMS {float(base.pow(2).mean().sqrt()):.3g}", flush=True)
    print(f"recompute: {rel(kvmodel.first_token(model, ids, 0, None, None)['logits'], base):.3g}", flush=True)
    for fraction in (0.1, 0.5):
        changed = []
        for blocks in ref:
            bits = blocks.view(torch.int16).clone()
            values = blocks.float()
            mask = (torch.rand(bits.shape, generator=g) < fraction) & torch.isfinite(values) & (values != 0)
            bits[mask] += 1  # one bf16 step away from zero's side or towards it, never across a sign
            changed.append(bits.view(torch.bfloat16))
        print(f"one bf16 step on {fraction:.0%} of the KV values: {rel(suffix(changed), base):.3g}", flush=True)
    order = torch.randperm(nb, generator=g)
    print(f"the prefix's blocks shuffled: {rel(suffix([blocks[order] for blocks in ref]), base):.3g}", flush=True)
    print(f"the layers' KV in reverse order: {rel(suffix(ref[::-1]), base):.3g}", flush=True)
    print(f"{time.time() - t:.0f} s", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: logit_sensitivity.py LAYERS PREFIX_TOKENS")
    main(int(sys.argv[1]), int(sys.argv[2]))
