"""A Llama-2-style tokenizer (SentencePiece-like BPE that adds a BOS), trained in a moment: none of the bundled
checkpoints adds a BOS."""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, processors, trainers

from llm_engine.model.tokenizer import Tokenizer as LLMTokenizer


def bos_metaspace_tokenizer(folder: Path, texts: list[str]) -> LLMTokenizer:
    """"▁" for spaces and before the text, a `<s>` (id 1) added, the decoder's Strip; trained on `texts`."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(texts * 50, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                                            initial_alphabet=["▁"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "clean_up_tokenization_spaces": False}))
    return LLMTokenizer(folder)
