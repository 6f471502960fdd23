"""An LLM inference engine whose hot paths are OpenAI Triton kernels (no dependency on the Triton server)."""
from llm_engine.async_engine import AsyncLLMEngine, EngineClosedError
from llm_engine.config import EngineConfig
from llm_engine.llm import LLM
from llm_engine.llm_engine import LLMEngine
from llm_engine.outputs import EngineStats, RequestFailedError, RequestOutput, RequestStats
from llm_engine.sampling_params import SamplingParams
from llm_engine.scheduler import EngineOverloadedError

__all__ = [
    "LLM", "LLMEngine", "AsyncLLMEngine", "SamplingParams", "EngineConfig", "RequestOutput", "RequestStats",
    "EngineStats", "EngineOverloadedError", "EngineClosedError", "RequestFailedError",
]
