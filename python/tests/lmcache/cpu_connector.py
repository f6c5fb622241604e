"""An LMCache GPU connector for CPU tensors (LMCache 0.5.6's own connectors need CUDA and its compiled
cuda_ops). It moves chunks between LMCache MemoryObjs (KV_2LTD: [2, layers, tokens, heads x
head_size]) and a KV tensor laid out the same way, [2, layers, all tokens, heads x head_size], on any
torch device: the five methods of GPUConnectorInterface
(lmcache/v1/gpu_connector/gpu_connectors.py)."""

from __future__ import annotations

import torch
from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface


class CPUKVConnector(GPUConnectorInterface):
    def __init__(self, metadata):
        self.layers = metadata.kv_shape[0]
        self.hidden = metadata.kv_shape[3] * metadata.kv_shape[4]

    def from_gpu(self, memory_obj, start, end, **kwargs):
        memory_obj.tensor.copy_(kwargs["kvcaches"][:, :, start:end, :])

    def to_gpu(self, memory_obj, start, end, **kwargs):
        kwargs["kvcaches"][:, :, start:end, :].copy_(memory_obj.tensor)

    def batched_from_gpu(self, memory_objs, starts, ends, **kwargs):
        for m, s, e in zip(memory_objs, starts, ends):
            self.from_gpu(m, s, e, **kwargs)

    def batched_to_gpu(self, memory_objs=None, starts=None, ends=None, **kwargs):
        for m, s, e in zip(memory_objs, starts, ends):
            self.to_gpu(m, s, e, **kwargs)
        if kwargs["kvcaches"].is_cuda:
            torch.cuda.synchronize(kwargs["kvcaches"].device)

    def get_shape(self, num_tokens):
        return torch.Size([2, self.layers, num_tokens, self.hidden])
