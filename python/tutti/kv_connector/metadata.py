"""What the scheduler side sends to every worker each step, and what workers send back, as plain
picklable values (vLLM pickles the connector metadata into the scheduler output it sends to workers)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class BlockTransfer:
    """Blocks of one request to load or save: keys[i] (vLLM's block hash) <-> block_ids[i] (vLLM's
    KV cache block, the same index in every layer)."""

    req_id: str
    keys: list[bytes]
    block_ids: list[int]

    def __post_init__(self):
        if len(self.keys) != len(self.block_ids):
            raise ValueError(f"BlockTransfer {self.req_id}: {len(self.keys)} keys but {len(self.block_ids)} block ids")


@dataclasses.dataclass
class StepMetadata:
    """One engine step: loads to finish before their layers are computed (synchronous, layer by layer),
    saves of the blocks this step fills, and the requests preempted before it."""

    step: int = 0
    loads: list[BlockTransfer] = dataclasses.field(default_factory=list)
    saves: list[BlockTransfer] = dataclasses.field(default_factory=list)
    preempted: list[str] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict:
        def transfers(items):
            return [{"req_id": t.req_id, "keys": [k.hex() for k in t.keys], "block_ids": list(t.block_ids)}
                    for t in items]
        return {"step": self.step, "loads": transfers(self.loads), "saves": transfers(self.saves),
                "preempted": list(self.preempted)}

    @classmethod
    def from_json(cls, data: dict) -> "StepMetadata":
        def transfers(items):
            return [BlockTransfer(t["req_id"], [bytes.fromhex(k) for k in t["keys"]], list(t["block_ids"]))
                    for t in items]
        return cls(step=data["step"], loads=transfers(data["loads"]), saves=transfers(data["saves"]),
                   preempted=list(data["preempted"]))


@dataclasses.dataclass
class WorkerReport:
    """Keys each tensor-parallel rank committed since its last report: {tp_rank: [key, ...]}.
    The scheduler side announces a block (vLLM's BlockStored event) once every rank committed it."""

    committed: dict[int, list[bytes]] = dataclasses.field(default_factory=dict)

    def merged(self, other: "WorkerReport") -> "WorkerReport":
        """A new report with both reports' keys (vLLM folds the ranks' reports pairwise)."""
        out = {rank: list(keys) for rank, keys in self.committed.items()}
        for rank, keys in other.committed.items():
            out.setdefault(rank, []).extend(keys)
        return WorkerReport(out)
