"""The model side of bench/model/ttft.py: a Llama-family decoder built from a transformers config
with random weights, its KV cache as blocks, and the cache that restores a prefix layer by layer.

Shapes (one layer, one request, batch 1):
- transformers' DynamicCache keeps K and V as (1, kv_heads, tokens, head_dim).
- A block is `block_tokens` consecutive tokens of one layer: K then V, each (kv_heads, block_tokens,
  head_dim) contiguous, so a layer's blocks are one tensor (blocks, 2, kv_heads, block_tokens,
  head_dim) and block b is `t[b]`: two pieces of kv_heads x block_tokens x head_dim x dtype bytes
  (512 KiB for 8 KV heads, 256 tokens, head dim 128, bf16). That is the unit the KV store stores,
  one key per block, and what every reader restores (readers.py).
- RestoringLayer (a DynamicLayer) stands for a layer whose first `prefix_tokens` tokens are being
  restored: it reports them in get_seq_length (so positions and the causal mask cover the prefix
  before a byte has arrived), and its update() first calls the gate for its layer (wait for the
  restore, e.g. KvStore.wait_layer), then lays the restored blocks and the new tokens' K/V out as
  one (1, kv_heads, prefix + new, head_dim) tensor. So layer L attends while layers L+1... load.
"""

from __future__ import annotations

import contextlib
import hashlib
import time

import torch


def build_model(shape: dict, layers: int, max_tokens: int, device: torch.device, dtype: torch.dtype, seed: int):
    """A LlamaForCausalLM of `shape` (an entry of data/model_shapes.json) with `layers` layers and
    random weights (seeded), in `dtype` on `device`, eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    kwargs = dict(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                  intermediate_size=shape["intermediate_size"], num_hidden_layers=layers,
                  num_attention_heads=shape["attention_heads"], num_key_value_heads=shape["kv_heads"],
                  head_dim=shape["head_dim"], max_position_embeddings=max(8192, max_tokens), rms_norm_eps=1e-5,
                  tie_word_embeddings=False, attn_implementation="sdpa")
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5:  # 5.0 moved rope_theta into rope_parameters
        config = LlamaConfig(rope_parameters={"rope_type": "default", "rope_theta": float(shape["rope_theta"])},
                             **kwargs)
    else:  # 4.x would keep an unknown rope_parameters as a plain attribute and use its default theta
        config = LlamaConfig(rope_theta=float(shape["rope_theta"]), **kwargs)
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # parameters are created in dtype, never in fp32 first
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    # Our own seeded initialisation, independent of how a transformers version initialises (or
    # skips) weights: N(0, 0.02) for every matrix and the embedding, 1 for the RMSNorm scales.
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.02, generator=generator)
            else:
                p.fill_(1.0)
    model.eval()
    return model, config


def parameter_counts(model) -> dict:
    """Parameters of the decoder layers (+ final norm) and of the embedding and LM head."""
    embed = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "non_embedding": total - embed}


def forward_flops(non_embedding_params: int, layers: int, heads: int, head_dim: int, past: int, new: int) -> float:
    """Matrix FLOPs of one forward over `new` tokens after `past` cached ones: 2 per weight per token,
    plus QK^T and AV with a causal mask (token i attends to past + i + 1 keys), LM head excluded."""
    weights = 2.0 * non_embedding_params * new
    keys = new * past + new * (new + 1) / 2.0
    return weights + layers * 4.0 * heads * head_dim * keys


def block_keys(model_id: str, tokens: torch.Tensor, block_tokens: int) -> list[bytes]:
    """The prefix hash of each full block: sha256(previous key || the block's token ids as int32 LE),
    seeded with sha256(model_id), as a prefix cache names blocks (vLLM's chained block hashes)."""
    ids = tokens.to("cpu", torch.int32).numpy().astype("<i4")
    h = hashlib.sha256(model_id.encode()).digest()
    keys = []
    for b in range(len(ids) // block_tokens):
        h = hashlib.sha256(h + ids[b * block_tokens:(b + 1) * block_tokens].tobytes()).digest()
        keys.append(h)
    return keys


def blockify_into(destination: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, block_tokens: int) -> None:
    """DynamicCache's (1, kv_heads, tokens, head_dim) K and V -> destination (blocks, 2, kv_heads,
    block_tokens, head_dim); tokens must be blocks x block_tokens."""
    _, kv_heads, tokens, head_dim = keys.shape
    blocks = tokens // block_tokens
    destination[:blocks, 0].copy_(keys[0].reshape(kv_heads, blocks, block_tokens, head_dim).permute(1, 0, 2, 3))
    destination[:blocks, 1].copy_(values[0].reshape(kv_heads, blocks, block_tokens, head_dim).permute(1, 0, 2, 3))


def unblockify_with(blocks: torch.Tensor, new: torch.Tensor, kind: int) -> torch.Tensor:
    """blocks (n, 2, kv_heads, block_tokens, head_dim) [kind: 0 = K, 1 = V] followed by new
    (1, kv_heads, s, head_dim) as one (1, kv_heads, n x block_tokens + s, head_dim) tensor."""
    n, _, kv_heads, block_tokens, head_dim = blocks.shape
    prefix = n * block_tokens
    out = torch.empty((1, kv_heads, prefix + new.shape[2], head_dim), dtype=new.dtype, device=new.device)
    out[0, :, :prefix].view(kv_heads, n, block_tokens, head_dim).copy_(blocks[:, kind].permute(1, 0, 2, 3))
    out[:, :, prefix:].copy_(new)
    return out


class Marks:
    """Time marks on the compute stream (CUDA events) or on the host clock (CPU): elapsed() between
    two marks is GPU time on CUDA, wall time on the CPU. Read them after the stream is synchronized."""

    def __init__(self, stream):
        self.stream = stream

    def mark(self):
        if self.stream is None:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def elapsed(self, a, b) -> float:
        if self.stream is None:
            return b - a
        return a.elapsed_time(b) / 1e3


class LayerGate:
    """Called by RestoringLayer.update(l): marks the compute stream, waits for layer l's restore on
    the host (the reader's wait_layer), marks again. before[l] -> after[l] is how long the compute
    stream sat idle waiting for layer l (CUDA events: zero when the host got there before the GPU ran
    out of queued work)."""

    def __init__(self, wait_layer, layers: int, marks: Marks):
        self.wait_layer, self.marks = wait_layer, marks
        self.before = [None] * layers
        self.after = [None] * layers
        self.host_ready = [0.0] * layers

    def __call__(self, layer: int) -> None:
        self.before[layer] = self.marks.mark()
        self.wait_layer(layer)
        self.host_ready[layer] = time.perf_counter()
        self.after[layer] = self.marks.mark()


def restoring_cache(layers: int, restored: list[torch.Tensor], blocks: int, gate: LayerGate):
    """A DynamicCache whose layer l holds `blocks` restored blocks of restored[l] (once gate(l)
    returned) followed by the new tokens."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    prefix_tokens = blocks * restored[0].shape[3]

    class RestoringLayer(DynamicLayer):
        def __init__(self, index: int):
            super().__init__()
            self.index = index
            self.restored = False

        def get_seq_length(self) -> int:
            return super().get_seq_length() if self.restored else prefix_tokens

        def update(self, key_states, value_states, *args, **kwargs):
            if self.restored:
                return super().update(key_states, value_states, *args, **kwargs)
            gate(self.index)
            source = restored[self.index][:blocks]
            self.dtype, self.device = key_states.dtype, key_states.device
            self.keys = unblockify_with(source, key_states, 0)
            self.values = unblockify_with(source, value_states, 1)
            self.is_initialized = True
            self.restored = True
            return self.keys, self.values

    cache = DynamicCache()
    cache.layers = [RestoringLayer(i) for i in range(layers)]
    cache.layer_class_to_replicate = None
    return cache


@torch.inference_mode()
def first_token(model, input_ids: torch.Tensor, position_start: int, cache, stream, marks: Marks | None = None):
    """One forward of input_ids (1-D) at positions position_start.., then the LM head on the last
    position only (the first generated token). Returns a dict: logits (fp32, CPU), token (its id),
    t_token (perf_counter() once the id was read back: the GPU is done), cache (the model's cache),
    start and end marks on the compute stream when `marks` is given."""
    ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
    with ctx:
        start = marks.mark() if marks is not None else None
        ids = input_ids.unsqueeze(0)
        positions = torch.arange(position_start, position_start + ids.shape[1], device=ids.device).unsqueeze(0)
        out = model.model(input_ids=ids, position_ids=positions, past_key_values=cache, use_cache=True)
        logits = model.lm_head(out.last_hidden_state[:, -1:, :])[0, -1]
        token = torch.argmax(logits)
        end = marks.mark() if marks is not None else None
        token_id = int(token.item())
        t_token = time.perf_counter()
        logits = logits.float().cpu()
    return {"logits": logits, "token": token_id, "t_token": t_token, "cache": out.past_key_values,
            "start": start, "end": end}
