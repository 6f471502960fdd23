"""The llm's `stop_reason` output (asked for by `return_stop_reason`): vLLM's CompletionOutput.stop_reason
as JSON, so that one BYTES output carries either of its kinds: the stop string that ended the answer
(`"\\n\\n"`), the id of the stop_token_ids token that did (`128009`), or `null`: ended by the eos,
max_tokens or an abort, and on every response before the last."""
from __future__ import annotations

import json


def stop_reason_json(stop_reason: int | str | None, final: bool) -> bytes:
    return json.dumps(stop_reason if final else None).encode()
