"""The model folder's HF fast tokenizer (tokenizer.json + tokenizer_config.json), local files only."""
from __future__ import annotations

from pathlib import Path

from jinja2 import TemplateError
from transformers import PreTrainedTokenizerFast

from llm_engine.model.token_bytes import TokenBytes
from llm_engine.model_config import read_eos_token_ids

# Text that transformers' clean_up_tokenization changes (" ." -> "."): decoded with and without the
# wrapper, it shows whether this tokenizer's decode applies that clean-up.
_CLEANUP_PROBE = "a . b , c ! d ? e n't f 's"


class Tokenizer:
    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"{path / 'tokenizer.json'} not found: the engine loads HF fast tokenizers (tokenizer.json) only")
        # The generic fast class keeps tokenizer.json's pipeline exactly as saved, whatever the
        # model-specific tokenizer_class in tokenizer_config.json.
        self.hf_tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        eos = [self.hf_tokenizer.eos_token_id, *read_eos_token_ids(path)]
        # Both count: chat models often end turns with a token other than the tokenizer's eos.
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(e for e in eos if e is not None))
        # decode() runs for every generated token: the Rust tokenizer directly, without the wrapper's
        # argument conversion (most of its cost), plus the wrapper's clean-up where it applies one.
        self._backend = self.hf_tokenizer.backend_tokenizer
        probe = self.encode(_CLEANUP_PROBE, add_special_tokens=False)
        self.cleans_up = self.hf_tokenizer.decode(probe) != self._backend.decode(probe, skip_special_tokens=False)
        # token_bytes(id, skip_special_tokens): a token's own bytes (logprobs' `bytes`), one cache for every request
        self.token_bytes = TokenBytes(self.hf_tokenizer)

    @property
    def eos_token_id(self) -> int | None:
        return self.eos_token_ids[0] if self.eos_token_ids else None

    @property
    def bos_token_id(self) -> int | None:
        return self.hf_tokenizer.bos_token_id

    @property
    def vocab_size(self) -> int:
        """Tokens the tokenizer can produce, added special tokens included."""
        return len(self.hf_tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf_tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, clean_up: bool = True) -> str:
        """The same text as the HF tokenizer's decode(); `clean_up` False leaves out its clean-up
        (" ." -> "." and the like, where `cleans_up`), which looks across token boundaries."""
        text = self._backend.decode(token_ids, skip_special_tokens=skip_special_tokens)
        return self.clean_up(text) if clean_up and self.cleans_up else text

    def clean_up(self, text: str) -> str:
        """The HF tokenizer's clean-up of decoded text."""
        return self.hf_tokenizer.clean_up_tokenization(text)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True, tools: list[dict] | None = None,
                            continue_final_message: bool = False, documents: list[dict] | None = None,
                            **variables) -> list[int] | str:
        """Render messages with the folder's chat template -> prompt token ids (or the text).

        `tools` (OpenAI's tool objects) and `documents` go to the template, which renders them its own way
        (or not); `continue_final_message` leaves the last message open (no end of turn) for the model to
        continue; `variables` are the template's own (e.g. `enable_thinking`), as vLLM's chat_template_kwargs.
        The text is encoded without special tokens: the template already wrote them (e.g. BOS).
        """
        if not self.hf_tokenizer.chat_template:
            raise ValueError("the tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)")
        try:
            text = self.hf_tokenizer.apply_chat_template(
                messages, tools=tools or None, documents=documents, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, tokenize=False, **variables)
        except (TemplateError, TypeError) as exc:  # its raise_exception() (roles out of order), a value it cannot add
            raise ValueError(f"messages: the model's chat template refused them: {exc}") from None
        except ValueError as exc:  # transformers' own checks: e.g. a continued message the template does not show
            first = (str(exc).splitlines() or [""])[0]  # its later lines repeat the whole rendered chat
            raise ValueError(f"messages: the model's chat template refused them: {first[:300]}") from None
        return self.encode(text, add_special_tokens=False) if tokenize else text
