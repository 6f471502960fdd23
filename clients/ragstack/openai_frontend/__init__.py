"""An OpenAI-compatible API for the whole stack, as its own process: chat and completions (an llm, or
`rag` with its sources), embeddings and rerank, the models list, load and unload. It speaks gRPC to
Triton (tritonclient.grpc.aio; a stream per request for decoupled models), so it works the same with
the bundled server and the nvcr.io image. `python -m ragstack.openai_frontend` runs it; the launcher
starts one with each server (port 9000 under `ragstack serve`). docs/operations.md, "The OpenAI API".
"""

DEFAULT_PORT = 9000   # `ragstack serve`'s and docker-compose's
