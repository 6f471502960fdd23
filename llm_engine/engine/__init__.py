"""The engine's front: requests in, outputs out.

The public `LLM` (offline) and `LLMEngine` (one step per call), the loop that serves an engine from
a thread or from its own process, the clients that stream a request's outputs to asyncio callers
(`AsyncLLMEngine` in-process, `EngineProcessClient` over a socket, both `EngineClient`s), input
validation and tokenization, detokenization and output assembly, and the wire protocol.
"""
