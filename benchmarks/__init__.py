"""Benchmarks: scripts, not timed tests, each comparing side by side in one run (the engine against HF
`generate()`, through Triton against in-process, ...) and against the physical limit measured in the run.

Each runs as a module from the repository root, `python -m benchmarks.bench_engine ...` (or as a file,
`python benchmarks/bench_engine.py ...`, where the project is installed), prints its table and appends
one JSON record of the run (date UTC, machine, host, command, commit, settings, the table's rows, notes;
benchmarks/record.py) to `benchmarks/results/<benchmark>.jsonl`, or to the file `--record` names ('' to
skip). `python -m benchmarks.report` regenerates docs/benchmarks.md from those files: the latest run of
each configuration (the same settings on the same machine). What was tried, and what the figures
meant, goes by hand to docs/benchmarks-journal.md.

On the lent GPU machine the project is not installed: start commands with
`export PYTHONPATH=$PWD:$PWD/clients`, and put `RAGSTACK_COMMIT=<hash>` (the commit sent) in the command,
since the copy of the repository there may name another commit than the one it holds. Write the record
where it comes back (`--record $OUT/engine.jsonl`) and append its line to benchmarks/results/ here.
`bench_serving` and `bench_reload` start the bundled Triton server: they run under
`source .carry/on-device.sh` (its Python stub needs numpy < 2); `bench_engine` runs with the image's own
`python3`: its HF rows import transformers' models, which fail in the carry venv (the image's SciPy and
scikit-learn do not load with numpy 1.26; the served HF baseline hides them itself). `bench_kernels` runs
either way.
`python3 -m benchmarks.make_random_model --shape llama3-8b --out /tmp/l8b` writes the Llama-3-8B-shaped
checkpoint the GPU benchmarks run on (about 30 s).
One-command GPU scripts (a time limit per step, results in $OUT, a summary printed last): `gpu_fp8.sh` (FP8
weights and KV), `gpu_serving.sh` (bench_serving through Triton and the OpenAI frontend; PROFILE=1 adds py-spy
and top on the engine process), `gpu_rag.sh` (the RAG pipeline with the 8B llm: `bench_rag_gpu`). The RAG one
needs two device calls, since .carry and its artifacts do not fit into one 64 MiB copy: build `.carry-rag/`
here with `python -m benchmarks.pack_rag_gpu` (int8 ONNX models, the index, faiss; ~26 MiB), run `source
.carry/on-device.sh` with `.carry` carried, then `RAGSTACK_COMMIT=<hash> bash benchmarks/gpu_rag.sh` with
`.carry-rag` carried, on the same warm machine.

Tools that record nothing: `pyspy_summary` (py-spy's collapsed stacks per thread), `profile_engine` (a window
of engine steps on the GPU: kernels by name, device busy against wall time, host time by phase),
`kernel_report` (an attention kernel or a fused projection compiled for a GPU on this CPU, with that GPU's launch config: registers,
spills, shared memory, each loop's instructions; run it before spending device time on a kernel change).
"""
