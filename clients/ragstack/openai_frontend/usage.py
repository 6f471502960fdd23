"""OpenAI's `usage` of a generation: each prompt's tokens once (its n choices share it), and every
choice's output tokens, as the llm counts them (return_num_input_tokens / return_num_output_tokens)."""
from __future__ import annotations


class Usage:
    def __init__(self, counted: bool, prompts: int, n: int):
        """`counted`: the model reports token counts (the llm does, and rag relays the llm's)."""
        self.counted, self.n = counted, n
        self._prompt = [0] * prompts
        self._completion = [0] * (prompts * n)

    def add(self, choice: int, prompt_tokens: int | None, completion_tokens: int) -> None:
        if prompt_tokens is not None:
            self._prompt[choice // self.n] = prompt_tokens
        self._completion[choice] += completion_tokens

    def as_dict(self) -> dict | None:
        """The whole request's: every prompt once, every choice's output."""
        return self._dict(sum(self._prompt), sum(self._completion))

    def of_choice(self, choice: int, asked: bool, started: bool = True) -> dict | None:
        """vLLM's continuous usage on a choice's chunk, where `asked`: its prompt's tokens and its own output so
        far (none on the chunk that starts it); None unasked (not built for every chunk)."""
        if not asked:
            return None
        return self._dict(self._prompt[choice // self.n], self._completion[choice] if started else 0)

    def _dict(self, prompt: int, completion: int) -> dict | None:
        if not self.counted:
            return None
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
