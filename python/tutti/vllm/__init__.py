"""Tutti for vLLM: a KV connector that restores a prefix's KV cache layer by layer from the Tutti KV
block store, and an OffloadingSpec for vLLM's native offloading connector. docs/vllm.md is the user's page.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "TuttiConnector",
        "kv_connector_module_path": "tutti.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"path": "/nvme/kv/rank{rank}", "capacity_bytes": 500000000000}}'

Written against one vLLM release (``tutti.kv_connector.config.SUPPORTED_VLLM``); importing this module
with another release raises ImportError naming both. The engine-independent logic is in
``tutti.kv_connector``, which does not import vLLM.
"""

from __future__ import annotations

from tutti.kv_connector.config import SUPPORTED_VLLM


def check_vllm_version(version: str) -> None:
    """Raises ImportError unless `version` is a release of the supported series."""
    if version != SUPPORTED_VLLM and not version.startswith(SUPPORTED_VLLM + "."):
        raise ImportError(f"tutti.vllm supports vLLM {SUPPORTED_VLLM}.x (tested with 0.33.0); the installed vLLM is "
                          f"{version}: pip install 'vllm=={SUPPORTED_VLLM}.*' (docs/vllm.md)")


import vllm as _vllm  # noqa: E402

check_vllm_version(_vllm.__version__)

from .connector import TuttiConnector, TuttiConnectorMetadata, TuttiWorkerMetadata  # noqa: E402,F401
from .offloading import TuttiOffloadingSpec  # noqa: E402,F401

__all__ = ["TuttiConnector", "TuttiOffloadingSpec", "check_vllm_version"]
