"""The vLLM tests read model configs from local folders only: no network (CI machines may have none)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
