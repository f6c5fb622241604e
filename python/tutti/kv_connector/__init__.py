"""The engine-independent half of Tutti's vLLM integration: configuration, the scheduler side's
decisions, the worker side's layer-wise loads and asynchronous saves, and the native offloading
worker. It imports torch and tutti, never vLLM, so it runs where vLLM cannot be installed (the GPU
machine replays vLLM's recorded calls through it). ``tutti.vllm`` is the vLLM glue around it.
"""

from .config import ConfigError, ConnectorConfig, EngineFacts, parse_config, validate_engine  # noqa: F401
from .metadata import BlockTransfer, StepMetadata, WorkerReport  # noqa: F401
