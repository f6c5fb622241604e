"""The scheduler side's decisions, without vLLM: how many tokens a request can restore, which blocks
each step loads and saves, when a finished request's blocks may be freed, and which blocks to announce
as stored.

The commit rule: a block counts as stored only when every tensor-parallel rank committed it. Each rank
has its own store (its own directory and namespace); a lookup asks every rank's store (read-only, or
this process's writer) for the stored prefix and takes the minimum.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Sequence

from . import stores
from .config import ConnectorConfig, EngineFacts, namespace
from .metadata import BlockTransfer, StepMetadata, WorkerReport

#: Keys remembered for BlockStored events until every rank committed them (oldest dropped first).
MAX_EVENT_KEYS = 1 << 16


@dataclasses.dataclass
class _Request:
    hashes: Sequence[bytes]             # vLLM's request.block_hashes (the live list: it grows with tokens)
    tokens: Callable[[], Sequence[int]]  # the request's token ids (for events)
    block_ids: list[int] = dataclasses.field(default_factory=list)
    save_from: int = 0                  # blocks [0, save_from) are stored or already scheduled to be saved
    had_saves: bool = False             # saves were sent to the workers: they report the request finished
    loaded: dict[int, int] = dataclasses.field(default_factory=dict)  # block id -> block index, loads


@dataclasses.dataclass(frozen=True)
class StoredBlock:
    """A block every rank committed: what vLLM's BlockStored event carries."""

    key: bytes
    parent: bytes | None
    token_ids: tuple[int, ...]


class SchedulerSide:
    """One per engine (vLLM builds the scheduler-side connector once, in the engine core)."""

    def __init__(self, config: ConnectorConfig, facts: EngineFacts, *, events: bool = False,
                 lookup: Callable[[int, list[bytes]], int] | None = None):
        self.config = config
        self.facts = facts
        self.block_size = facts.block_size
        self.directories = [config.directory(r, facts.dp_rank) for r in range(facts.tp_size)]
        self.namespaces = [namespace(config, facts, r) for r in range(facts.tp_size)]
        self.loads_enabled = facts.kv_role in ("kv_both", "kv_consumer")
        self.saves_enabled = facts.kv_role in ("kv_both", "kv_producer")
        self.events_enabled = events
        self._lookup = lookup or self._store_lookup
        self._requests: dict[str, _Request] = {}
        self._hits: dict[str, tuple[int, int]] = {}   # req_id -> (start block, stored blocks), last lookup
        self._loads: list[BlockTransfer] = []
        self._step = 0
        self._event_info: collections.OrderedDict[bytes, StoredBlock] = collections.OrderedDict()
        self._committed_by: dict[bytes, set[int]] = {}
        self._stored: list[StoredBlock] = []
        # lookups: get_num_new_matched_tokens calls; looked_up_blocks: blocks past the local hit asked for;
        # hit_blocks: blocks the store will restore (docs/vllm.md, "Start-up line and counters").
        self.statistics = collections.Counter({"lookups": 0, "looked_up_blocks": 0, "hit_blocks": 0})

    # -- lookups -------------------------------------------------------------------------------

    def _store_lookup(self, rank: int, keys: list[bytes]) -> int:
        return stores.lookup(self.config, self.directories[rank], self.namespaces[rank], keys)

    def stored_prefix(self, keys: list[bytes]) -> int:
        """Blocks of `keys` (a prefix) that every rank committed: the minimum over the ranks' stores."""
        n = len(keys)
        for rank in range(len(self.directories)):
            if n == 0:
                break
            n = min(n, self._lookup(rank, keys[:n]))
        return n

    # -- vLLM's scheduler calls ----------------------------------------------------------------

    def matched_tokens(self, req_id: str, hashes: Sequence[bytes], num_tokens: int, num_computed: int) -> int:
        """Tokens beyond `num_computed` (the block-aligned local hit) that loads can restore: whole
        blocks, and never the last token (vLLM computes at least one token of a request)."""
        if not self.loads_enabled:
            return 0
        start = num_computed // self.block_size
        stored = self.stored_prefix(list(hashes[start:]))
        loadable = max(0, min(stored, (num_tokens - 1) // self.block_size - start))
        self._hits[req_id] = (start, stored)
        self.statistics["lookups"] += 1
        self.statistics["looked_up_blocks"] += max(0, len(hashes) - start)
        self.statistics["hit_blocks"] += loadable
        return loadable * self.block_size

    def after_alloc(self, req_id: str, hashes: Sequence[bytes], tokens: Callable[[], Sequence[int]],
                    block_ids: list[int], num_external_tokens: int) -> None:
        """Blocks were allocated for a request taken from the waiting queue (new, or resumed after
        preemption); `block_ids` are all of its blocks. Schedules the load of the external tokens."""
        state = self._requests.get(req_id)
        if state is None:
            state = self._requests[req_id] = _Request(hashes=hashes, tokens=tokens)
        state.hashes, state.tokens, state.block_ids = hashes, tokens, list(block_ids)
        start, stored = self._hits.pop(req_id, (0, 0))
        state.save_from = start + stored  # blocks before the local hit were saved by whoever computed them
        state.loaded = {}
        if num_external_tokens > 0:
            n = num_external_tokens // self.block_size
            keys, ids = list(hashes[start:start + n]), state.block_ids[start:start + n]
            self._loads.append(BlockTransfer(req_id, keys, ids))
            state.loaded = {b: start + i for i, b in enumerate(ids)}

    def build_step(self, scheduled: list[tuple[str, int, int, list[int]]], preempted: Sequence[str]) -> StepMetadata:
        """The step's metadata. `scheduled`: (req_id, computed tokens before the step, tokens scheduled,
        all block ids) of every scheduled request. Saves cover the blocks that become full in this step
        and are not stored yet; a key is saved once per step (two requests with one prefix)."""
        self._step += 1
        meta = StepMetadata(step=self._step, loads=self._loads, preempted=list(preempted))
        self._loads = []
        for req_id in preempted:
            state = self._requests.get(req_id)
            if state is not None:
                state.save_from = 0  # it comes back through the waiting queue (after_alloc)
        if self.saves_enabled:
            seen: set[bytes] = set()
            for req_id, computed, num_new, block_ids in scheduled:
                state = self._requests.get(req_id)
                if state is None:
                    continue
                state.block_ids = list(block_ids)
                full = min((computed + num_new) // self.block_size, len(state.hashes), len(block_ids))
                if full <= state.save_from:
                    continue
                keys, ids = [], []
                for i in range(state.save_from, full):
                    key = state.hashes[i]
                    if key in seen:
                        continue
                    seen.add(key)
                    keys.append(key)
                    ids.append(block_ids[i])
                    if self.events_enabled:
                        self._remember(key, state, i)
                state.save_from = full
                if keys:
                    meta.saves.append(BlockTransfer(req_id, keys, ids))
                    state.had_saves = True
        return meta

    def invalid_blocks(self, block_ids: set[int]) -> None:
        """Blocks whose load failed: vLLM recomputes them, and they are saved again from there."""
        for state in self._requests.values():
            bad = [state.loaded[b] for b in block_ids if b in state.loaded]
            if bad:
                state.save_from = min(state.save_from, min(bad))

    def finished(self, req_id: str) -> bool:
        """A request finished: True when workers hold its blocks until its saves are durable (vLLM
        then frees them when every rank reported the request in finished_sending)."""
        state = self._requests.pop(req_id, None)
        self._hits.pop(req_id, None)
        return state is not None and state.had_saves

    # -- what workers report -------------------------------------------------------------------

    def worker_report(self, report: WorkerReport | None) -> None:
        if report is None or not self.events_enabled:
            return
        ranks = len(self.directories)
        for rank, keys in report.committed.items():
            for key in keys:
                by = self._committed_by.setdefault(key, set())
                by.add(rank)
                if len(by) == ranks:
                    del self._committed_by[key]
                    info = self._event_info.pop(key, None)
                    if info is not None:
                        self._stored.append(info)
        while len(self._committed_by) > MAX_EVENT_KEYS:
            self._committed_by.pop(next(iter(self._committed_by)))

    def take_stored(self) -> list[StoredBlock]:
        out, self._stored = self._stored, []
        return out

    def _remember(self, key: bytes, state: _Request, index: int) -> None:
        tokens = state.tokens()
        parent = state.hashes[index - 1] if index > 0 else None
        self._event_info[key] = StoredBlock(key, parent,
                                            tuple(tokens[index * self.block_size:(index + 1) * self.block_size]))
        while len(self._event_info) > MAX_EVENT_KEYS:
            self._event_info.popitem(last=False)
