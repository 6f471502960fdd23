"""OpenAI's `usage` of a generation: each prompt's tokens once (its n choices share it), and every
choice's output tokens, as the llm counts them (return_num_input_tokens / return_num_output_tokens)."""
from __future__ import annotations


class Usage:
    def __init__(self, counted: bool, prompts: int, n: int):
        """`counted`: the model reports token counts (the llm does, and rag relays the llm's)."""
        self.counted, self.n = counted, n
        self._prompt = [0] * prompts
        self._completion = 0

    def add(self, choice: int, prompt_tokens: int | None, completion_tokens: int) -> None:
        if prompt_tokens is not None:
            self._prompt[choice // self.n] = prompt_tokens
        self._completion += completion_tokens

    def as_dict(self) -> dict | None:
        if not self.counted:
            return None
        prompt = sum(self._prompt)
        return {"prompt_tokens": prompt, "completion_tokens": self._completion,
                "total_tokens": prompt + self._completion}
