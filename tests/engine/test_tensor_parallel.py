"""Tensor parallelism: two ranks (this process and one worker; gloo on the CPU, NCCL on two GPUs
when there are) against one rank on the same weights; the worker processes' lifecycle (stop,
failure, rank 0's death), on the CPU."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import torch
from tiny_checkpoints import tiny_checkpoints  # noqa: F401  (session fixture)

from llm_engine import LLM, RequestFailedError, SamplingParams
from llm_engine.config import EngineConfig
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.sequence import Sequence
from llm_engine.errors import WorkerError

pytestmark = pytest.mark.slow  # starts processes or compiles kernels: not in `make test-fast`

PROMPTS = [
    "The capital of France is",
    "Retrieval augmented generation combines a search engine with a language model, so",
    "Two plus two",
]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
# A small token budget: the long prompt is prefilled in chunks, next to the others' decodes.
CONFIG = dict(device="cpu", dtype="float32", max_model_len=256, block_size=4, num_kv_blocks=128,
              max_num_batched_tokens=24, enable_prefix_caching=False)


def alive(pid: int) -> bool:
    """Running (an exited child that was not waited for yet is a zombie: not alive)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids: list[int], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(alive(p) for p in pids)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.device_count() >= 2 else [])


@pytest.fixture(scope="module", params=[(a, d) for d in DEVICES for a in ("tiny-llama", "tiny-qwen2")],
                ids=lambda p: "-".join(p))
def one_and_two_ranks(request, tiny_checkpoints):
    arch, device = request.param
    folder, config = str(tiny_checkpoints[arch]), {**CONFIG, "device": device}
    with LLM(folder, **config) as one, LLM(folder, tensor_parallel_size=2, **config) as two:
        yield one, two


def test_two_ranks_generate_the_same_greedy_tokens(one_and_two_ranks):
    one, two = one_and_two_ranks
    expected = [o.token_ids for o in one.generate(PROMPTS, GREEDY)]
    assert [o.token_ids for o in two.generate(PROMPTS, GREEDY)] == expected
    # Async scheduling: rank 0 filled the placeholders before broadcasting the step inputs.
    assert two.engine.get_stats().num_async_steps > 0


def test_two_ranks_follow_structured_output_constraints_alike(one_and_two_ranks):
    pytest.importorskip("xgrammar", reason="structured output needs xgrammar (a GPU image may lack it)")
    one, two = one_and_two_ranks
    guided = [SamplingParams(temperature=1.0, seed=i, max_tokens=32, structured_outputs=spec) for i, spec in
              enumerate([{"regex": r"[a-z]{2,6}-\d{3}"}, {"json": {"type": "object", "properties": {
                  "n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}}, None])]
    expected = one.generate(PROMPTS, guided)
    assert [o.token_ids for o in two.generate(PROMPTS, guided)] == [o.token_ids for o in expected]
    assert expected[1].finish_reason == "stop" and json.loads(expected[1].text)["n"] in range(10)


def test_two_ranks_give_close_logits(one_and_two_ranks):
    """A prefill batch, then a decode step, run by both runners on the same (scratch) blocks."""
    runners = [llm.engine.model_runner for llm in one_and_two_ranks]
    prompts = [runners[0].tokenizer.encode(p) for p in PROMPTS]
    logits = []
    for runner in runners:
        seqs, next_block = [], 0
        for ids in prompts:
            seq = Sequence(token_ids=list(ids), sampling_params=None)
            seq.block_table = list(range(next_block, next_block + len(ids) // CONFIG["block_size"] + 1))
            next_block += len(seq.block_table)
            seqs.append(seq)
        prefill = runner.execute(ScheduledBatch(seqs, [len(p) for p in prompts], [True] * len(seqs)))
        for seq, token in zip(seqs, prefill.argmax(dim=-1).tolist()):
            seq.num_computed_tokens = len(seq)
            seq.append_token(token)
        decode = runner.execute(ScheduledBatch(seqs, [1] * len(seqs), [True] * len(seqs)))
        logits.append((prefill, decode))
    for got, expected in zip(logits[1], logits[0]):
        assert got.shape == expected.shape == (len(PROMPTS), runners[0].vocab_size)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_close_stops_the_workers(one_and_two_ranks):
    runner = one_and_two_ranks[1].engine.model_runner
    pids = runner.worker_pids
    assert pids and all(alive(p) for p in pids)
    one_and_two_ranks[1].close()
    assert wait_gone(pids)
    assert [proc.returncode for proc in runner.workers.procs] == [0]  # left its loop, not killed
    with pytest.raises(RequestFailedError, match="closed"):
        one_and_two_ranks[1].generate(PROMPTS[:1], GREEDY)


def test_leaving_a_group_that_never_lets_go_ends_at_the_deadline(monkeypatch):
    """NCCL's destroy blocked for good on rank 0 of two H200s: the deadline still ends the close."""
    from llm_engine.worker import distributed

    released = threading.Event()
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: released.wait(30))
    start = time.monotonic()
    assert distributed.destroy_group(timeout_s=0.3) is False
    assert time.monotonic() - start < 2
    released.set()


@pytest.mark.parametrize("tp_size, field", [(3, "num_attention_heads 4"), (4, "num_key_value_heads 2")])
def test_shapes_that_do_not_split_are_refused(tiny_checkpoints, tp_size, field):
    with pytest.raises(ValueError, match=f"tensor_parallel_size {tp_size} must divide the model's {field}"):
        EngineConfig(model=str(tiny_checkpoints["tiny-llama"]), tensor_parallel_size=tp_size)


def test_a_worker_that_fails_to_start_is_reported_with_its_traceback(tiny_checkpoints, monkeypatch):
    # Read when the worker imports the engine (this process imported it long ago): only rank 1 fails.
    monkeypatch.setenv("LLM_ENGINE_KERNELS", "bogus")
    with pytest.raises(WorkerError, match=r"(?s)rank 1 exited with code 1.*Traceback.*LLM_ENGINE_KERNELS must be"):
        LLM(str(tiny_checkpoints["tiny-qwen2"]), tensor_parallel_size=2, **CONFIG)


def test_a_worker_that_fails_while_serving_fails_every_later_step_with_its_traceback(tiny_checkpoints):
    llm = LLM(str(tiny_checkpoints["tiny-qwen2"]), tensor_parallel_size=2, **CONFIG)
    try:
        assert llm.generate(PROMPTS[:1], GREEDY)[0].token_ids
        runner = llm.engine.model_runner
        runner.tp.send_command("step", sizes=[], num_values=-1)  # a step no worker can receive
        assert wait_gone(runner.worker_pids)
        for _ in range(2):  # the next step, and every later one
            with pytest.raises(RequestFailedError, match=r"(?s)rank 1 exited with code 1.*Traceback.*step_buffer"):
                llm.generate(PROMPTS[:1], GREEDY)
    finally:
        llm.close()
    assert not torch.distributed.is_initialized()  # the next engine may start a group


RANK0 = """
import sys, time
from llm_engine import LLM
llm = LLM(sys.argv[1], tensor_parallel_size=2, device="cpu", max_model_len=64, num_kv_blocks=16)
print(*llm.engine.model_runner.worker_pids, flush=True)
time.sleep(600)
"""


def test_workers_exit_when_rank0_is_killed(tiny_checkpoints):
    rank0 = subprocess.Popen([sys.executable, "-c", RANK0, str(tiny_checkpoints["tiny-qwen2"])],
                             stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in rank0.stdout.readline().split()]
        assert pids and all(alive(p) for p in pids)
    finally:
        rank0.kill()
        rank0.wait()
    assert wait_gone(pids)
