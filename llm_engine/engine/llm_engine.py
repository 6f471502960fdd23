"""The engine: requests in, one batched model step per call, a RequestDelta per request out.

Wires ModelRunner (forward pass), Scheduler + BlockManager (what runs, where its KV lives),
Sampler (next tokens) and one IncrementalDetokenizer per request (text, stop strings).
`step_deltas()` is what the serving loop (engine_loop.py) runs; `add_request` / `step()` are the
synchronous interface (LLM, tests), whose outputs are assembled from the same deltas.
Not thread-safe: one thread drives it.

Async scheduling: a step is launched (forward and sampling queued on the device) and left in
flight; the next `step()` schedules and launches the following step before it waits for the
sampled ids, so the host's scheduling and input preparation overlap the device's work. The
sequences of the step in flight are advanced with placeholder tokens (the scheduler treats them
as decoding one token further; the runner fills the real ids in on the device), then the ids are
read back and put in place, and only then are eos, stop tokens and stop strings seen: a sequence
they end has had one more token computed, which is dropped (its blocks are freed at once; the
device runs that step before any later one that reuses them). With `async_scheduling` off, each
step waits for the previous one's tokens before it is scheduled.
"""
from __future__ import annotations

import logging
import time
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as wait_for_futures
from dataclasses import dataclass

import torch

from llm_engine.config import EngineConfig
from llm_engine.core.block_manager import BlockManager
from llm_engine.core.scheduled_batch import ScheduledBatch
from llm_engine.core.scheduler import Scheduler
from llm_engine.core.sequence import Sequence
from llm_engine.engine.admission import admit
from llm_engine.engine.detokenizer import IncrementalDetokenizer
from llm_engine.engine.input_processor import EngineRequest, InputProcessor
from llm_engine.engine.output_processor import OutputAssembler
from llm_engine.engine.structured_output import (
    GrammarCompiler,
    PendingGrammar,
    RequestGrammar,
)
from llm_engine.outputs import EngineStats, RequestDelta, RequestOutput, RequestStats
from llm_engine.sampling_params import SamplingParams
from llm_engine.worker.model_runner import ModelRunner
from llm_engine.worker.prompt_logprobs import PromptLogprobs
from llm_engine.worker.sampler import Sampler, SamplerOutput
from llm_engine.worker.tp_runner import create_model_runner

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class RequestState:
    """A validated request's serving state in the engine."""

    request_id: str
    seq: Sequence
    detokenizer: IncrementalDetokenizer
    stats: RequestStats
    num_sent_tokens: int = 0  # output tokens (and their times) already in a delta
    # Only the final output is wanted (offline generation): without stop strings to check, the
    # tokens are detokenized in one window when it ends, and no output is built before.
    final_only: bool = False
    deferred_from: int = 0  # token_ids[deferred_from:deferred_from + num_deferred]: not yet detokenized
    num_deferred: int = 0
    grammar: RequestGrammar | None = None  # structured output: where the output is in its grammar
    failure: str | None = None  # why it ended with finish_reason "error", when the step itself did not fail
    failure_is_input: bool = False  # the failure is the request's own input (RequestRefusedError)


@dataclass(eq=False)
class LaunchedStep:
    """A step whose forward pass and sampling are queued on the device."""

    batch: ScheduledBatch
    result: SamplerOutput | None  # None: no sequence was sampled
    prompt: PromptLogprobs | None = None  # the batch's scored prompt positions


class LLMEngine:
    def __init__(self, config: EngineConfig, model_runner: ModelRunner | None = None) -> None:
        """`model_runner` defaults to a ModelRunner for config (rank 0's, starting the other ranks, when
        tensor_parallel_size > 1); pass one to share or substitute it."""
        self.config = config
        self.model_runner = model_runner if model_runner is not None else create_model_runner(config)
        self.tokenizer = self.model_runner.tokenizer
        self.max_model_len = config.max_model_len
        self.vocab_size = config.model_config.vocab_size  # logits width; ids at or above it are invalid
        self.processor = InputProcessor(self.tokenizer, self.max_model_len, self.vocab_size)
        eos = list(self.tokenizer.eos_token_ids)
        self.block_manager = BlockManager(self.model_runner.num_kv_blocks, config.block_size,
                                          config.enable_prefix_caching)
        self.scheduler = Scheduler(config, self.block_manager, eos)
        self.sampler = Sampler(eos)
        self._requests: dict[str, RequestState] = {}
        self._assemblers: dict[str, OutputAssembler] = {}  # requests of add_request: step() builds their outputs
        self._grammars: GrammarCompiler | None = None  # made for the first structured-output request
        self._compiling: dict[str, PendingGrammar] = {}  # structured requests waiting for their grammar
        self._failures: list[tuple[str, Exception]] = []  # requests refused after enqueue (take_failures)
        self._num_prompt_tokens = 0
        self._num_generation_tokens = 0
        self._num_async_steps = 0
        self._in_flight: LaunchedStep | None = None

    # --- requests -----------------------------------------------------------------------------

    def add_request(self, request_id: str, prompt: str | list[int] | None = None,
                    sampling_params: SamplingParams | dict | None = None,
                    prompt_token_ids: list[int] | None = None,
                    arrival_time: float | None = None, final_only: bool = False) -> None:
        """Queue a request; it joins the running batch at a coming step, and step() reports it.
        `final_only`: step() reports it once, when it finishes (as vLLM's FINAL_ONLY output kind),
        which saves the per-token text and output work that streaming needs; with stop strings,
        which are checked as each token arrives, it is still reported per token.

        Raises ValueError for bad input (nothing is queued) and EngineOverloadedError when the
        waiting queue is full.
        """
        request = self.processor.process(request_id, prompt, sampling_params, prompt_token_ids, arrival_time)
        admit(len(self.scheduler.waiting), self.config.max_waiting)
        state = self.make_request(request)
        state.final_only = final_only
        self.enqueue(state)
        self._assemblers[request_id] = OutputAssembler(request)

    def make_request(self, request: EngineRequest) -> RequestState:
        """The serving state of a validated request (safe from any thread)."""
        ids, params = request.prompt_token_ids, request.sampling_params
        seq = Sequence(token_ids=list(ids), sampling_params=params, request_id=request.request_id)
        detok = IncrementalDetokenizer(self.tokenizer, ids, params.stop, params.skip_special_tokens,
                                       params.include_stop_str_in_output)
        stats = RequestStats(arrival_time=request.arrival_time, num_prompt_tokens=len(ids))
        return RequestState(request.request_id, seq, detok, stats)

    def enqueue(self, request: RequestState) -> None:
        """Queue a request admitted already (its outputs go to step_deltas()' caller). A structured
        one waits for its grammar to compile (take_failures() reports a compile that fails)."""
        if request.request_id in self._requests:
            raise ValueError(f"request_id {request.request_id!r} is already in use")
        spec = request.seq.sampling_params.structured_outputs
        if spec is None:
            self.scheduler.add(request.seq)
        else:
            self.scheduler.check(request.seq)
            timeout = self.config.structured_output_compile_timeout_s
            self._compiling[request.request_id] = PendingGrammar(self._grammar_compiler().submit(spec), timeout)
        self._requests[request.request_id] = request

    def take_failures(self) -> list[tuple[str, Exception]]:
        """Requests that failed outside a step since the last call (their grammar did not compile),
        each with its exception (ValueError: the request's fault); they are gone from the engine."""
        failures, self._failures = self._failures, []
        return failures

    def abort(self, request_id: str) -> RequestDelta | None:
        """Finish the request with "abort" and free its KV blocks now (a token of the step in
        flight is dropped); its last delta. None if it is unknown (finished already)."""
        req = self._requests.get(request_id)
        if req is None:
            return None
        if self._compiling.pop(request_id, None) is not None:
            self.scheduler.finish(req.seq, "abort")  # never scheduled
        else:
            self.scheduler.abort(request_id)
        return self._delta(req)

    def abort_request(self, request_id: str) -> RequestOutput | None:
        """abort() for a request of add_request: its last output."""
        delta = self.abort(request_id)
        return None if delta is None else self._assemble([delta])[0]

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests)

    @property
    def request_ids(self) -> list[str]:
        return list(self._requests)

    # --- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """step_deltas(), as the outputs of the requests of add_request (a request that failed
        outside the step, as an output with finish_reason "error")."""
        deltas = self.step_deltas()
        deltas += [RequestDelta(rid, "", [], None, None, [], "error", f"{type(exc).__name__}: {exc}")
                   for rid, exc in self.take_failures()]
        return self._assemble(deltas)

    def step_deltas(self) -> list[RequestDelta]:
        """Launch one batched model step; a delta for every request that got a new token.

        The deltas are those of the step launched by the previous call (the tokens reach the host
        while this step runs, and are detokenized, stop strings checked, after its launch); an
        empty step hands out the last ones.
        """
        if self._compiling:
            self._admit_compiled(idle=self._in_flight is None and not self.scheduler.has_unfinished())
        prev, self._in_flight = self._in_flight, None
        overlap = prev is not None and self.config.async_scheduling
        done: list[tuple[RequestState, float]] = []
        if overlap:
            self.scheduler.advance(prev.batch)  # its sampled tokens as placeholders
        elif prev is not None:
            done = self._complete(prev)  # synchronous: the device idles until the launch below
        sampled_ids = prev.result.ids if overlap and prev.result is not None else None
        batch = self.scheduler.schedule()
        failure = None
        early: list[RequestDelta] = []
        if batch.seqs:
            self._account_scheduled(batch)
            try:
                logits = self.model_runner.execute(batch, sampled_ids)
                prompt = self.model_runner.prompt_logprobs if batch.prompt_rows else None
                masks = None
                if overlap and self._guided(batch):
                    # The masks follow the tokens of the step in flight: wait for them while the
                    # device runs this step's forward pass, then fill the masks (threads, off the GIL)
                    # while this thread detokenizes those tokens (the step's other host work, done
                    # before the sampling rather than after it), then sample.
                    done, overlap = self._complete(prev, advanced=True), False
                    self._num_async_steps += sampled_ids is not None
                    masks = self._grammars.fill_masks(self._grammars_of(batch))
                    early, done = self._emit(done), []
                self._in_flight = LaunchedStep(batch, self._sample(batch, logits, sampled_ids, masks), prompt)
            except Exception as exc:  # the batch is lost; its requests fail, the engine serves on
                logger.exception("model step failed for requests %s", [s.request_id for s in batch.seqs])
                failure = exc
        if overlap:
            self._num_async_steps += self._in_flight is not None and sampled_ids is not None
            done = self._complete(prev, advanced=True)
        deltas = early + self._emit(done)
        if failure is not None:
            deltas += [self._fail(seq, failure) for seq in batch.seqs if not seq.is_finished]
        return deltas

    def _account_scheduled(self, batch: ScheduledBatch) -> None:
        now = time.monotonic()
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            stats = self._requests[seq.request_id].stats
            if stats.first_scheduled_time is None:
                stats.first_scheduled_time = now
            if n > 1 or seq.num_output_tokens == 0:
                self._num_prompt_tokens += n

    def _sample(self, batch: ScheduledBatch, logits: torch.Tensor, sampled_ids: torch.Tensor | None,
                masks: Future | None = None):
        """Queue the sampling of the batch's sampled rows with their grammars' masks (`masks`, being
        filled already, or filled now); `sampled_ids` (on the device) are the tokens the batch's
        placeholders stand for."""
        sampled = [s for s, is_sampled in zip(batch.seqs, batch.sample) if is_sampled]
        if not sampled:
            return None
        bitmask = None
        if masks is not None:
            bitmask = masks.result()
        elif self._grammars is not None:
            bitmask = self._grammars.masks(self._grammars_of(batch))
        return self.sampler(logits, sampled, sampled_ids, bitmask=bitmask)

    def _grammars_of(self, batch: ScheduledBatch) -> list[RequestGrammar | None]:
        return [self._requests[s.request_id].grammar for s, is_sampled in zip(batch.seqs, batch.sample) if is_sampled]

    def _guided(self, batch: ScheduledBatch) -> bool:
        return self._grammars is not None and any(
            self._requests[s.request_id].grammar is not None for s, smp in zip(batch.seqs, batch.sample) if smp)

    def _grammar_compiler(self) -> GrammarCompiler:
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.tokenizer.eos_token_ids,
                                             self.config.structured_output_compile_timeout_s)
        return self._grammars

    def _admit_compiled(self, idle: bool) -> None:
        """Requests whose grammar compiled join the waiting queue; failed compiles are reported.
        `idle`: nothing else to run, so wait a moment for a compile rather than spin."""
        if idle:
            wait_for_futures([p.future for p in self._compiling.values()], timeout=0.005,
                             return_when=FIRST_COMPLETED)
        for request_id, pending in list(self._compiling.items()):
            error = pending.failed()
            if error is None and not pending.future.done():
                continue
            del self._compiling[request_id]
            req = self._requests[request_id]
            if error is not None:
                del self._requests[request_id]
                self._failures.append((request_id, error))
                continue
            req.grammar = self._grammars.matcher(pending.future.result())
            self.scheduler.add(req.seq)

    def _complete(self, step: LaunchedStep, advanced: bool = False) -> list[tuple[RequestState, float]]:
        """Wait for the step's sampled tokens and put them in its sequences (advance done already
        or not); the requests that got one, with the time it arrived."""
        result = step.result
        ids, logprobs, top = (result.token_ids, result.logprobs, result.top_logprobs) if result else ([], None, None)
        if step.prompt is not None:
            step.prompt.add_to(step.batch)
        if advanced:
            got = self.scheduler.resolve(step.batch, ids, logprobs, top)
        else:
            got = self.scheduler.postprocess(step.batch, ids, logprobs, top)
        self._num_generation_tokens += len(got)
        sampled_at = time.monotonic()
        done = [(self._requests[seq.request_id], sampled_at) for seq in got]
        for req, _ in done:
            if req.grammar is not None:
                self._follow_grammar(req)
        return done

    def _follow_grammar(self, req: RequestState) -> None:
        """The sampled token advances the request's grammar; a complete grammar ends the sequence."""
        seq = req.seq
        if not req.grammar.accept(seq.token_ids[-1]):
            # Every sampled token is one the mask allowed, unless it allowed none (the sampler then takes any):
            # the constraint has no way on from here, as `root ::= root` or a schema that is only `{"$ref": "#"}`.
            req.failure = (f"structured output: the constraint allows no token after {len(seq.output_token_ids) - 1} "
                           "generated, so no output can satisfy it; check the schema, grammar or regex")
            req.failure_is_input = True
            self.scheduler.finish(seq, "error")
        elif req.grammar.terminated and not seq.is_finished:
            self.scheduler.finish(seq, "stop")

    def _emit(self, done: list[tuple[RequestState, float]]) -> list[RequestDelta]:
        """Deltas of the requests that got a token."""
        deltas = []
        for req, sampled_at in done:
            try:
                if self._absorb_token(req, sampled_at):
                    deltas.append(self._delta(req))
            except Exception as exc:  # e.g. a detokenizer failure: only this request fails
                logger.exception("post-processing failed for request %s", req.request_id)
                deltas.append(self._fail(req.seq, exc))
        return deltas

    def _absorb_token(self, req: RequestState, sampled_at: float) -> bool:
        """Account and detokenize the request's last sampled token; a stop string ends it.
        False: nothing to report now (a final-only request's token, detokenized at its end)."""
        seq = req.seq
        params = seq.sampling_params
        req.stats.token_times.append(sampled_at)
        if req.final_only and not seq.is_finished and not req.detokenizer.has_stop_strings:
            if not req.num_deferred:
                req.deferred_from = len(seq.token_ids) - 1
            req.num_deferred += 1
            return False
        self._detokenize_deferred(req)
        # An eos / stop token ends the text without being part of it, unless include_stop_str_in_output
        # (as vLLM's v1 detokenizer; a stop string in its text is then the reason, as there).
        if seq.finish_reason != "stop" or params.include_stop_str_in_output:
            req.detokenizer.add_token(seq.token_ids[-1], check_stop=seq.num_output_tokens >= params.min_tokens,
                                      last=seq.is_finished)
            if req.detokenizer.stopped:
                seq.stop_reason = req.detokenizer.stop_string
                if seq.is_finished:  # hit max_tokens (or a stop token) on the very token that completed it
                    seq.finish_reason = "stop"
                else:
                    self.scheduler.finish(seq, "stop")
        return True

    @staticmethod
    def _detokenize_deferred(req: RequestState) -> None:
        """Detokenize the deferred tokens of a final-only request (by position: a step interrupted
        between advance and resolve leaves a placeholder after them)."""
        if req.num_deferred:
            start, n, req.num_deferred = req.deferred_from, req.num_deferred, 0
            req.detokenizer.add_tokens(req.seq.token_ids[start:start + n])

    def _fail(self, seq: Sequence, exc: Exception) -> RequestDelta:
        self.scheduler.finish(seq, "error")
        return self._delta(self._requests[seq.request_id], error=f"{type(exc).__name__}: {exc}")

    def _delta(self, req: RequestState, error: str | None = None) -> RequestDelta:
        seq, stats = req.seq, req.stats
        error_is_input = error is None and req.failure_is_input
        error = error or req.failure
        self._detokenize_deferred(req)  # an abort or failure ends it mid-way
        finished = seq.is_finished
        text = req.detokenizer.emit(finished=finished)
        out_ids = seq.output_token_ids
        sent, req.num_sent_tokens = req.num_sent_tokens, len(out_ids)
        if finished:
            stats.finished_time = time.monotonic()
            del self._requests[req.request_id]
        wants = seq.sampling_params.logprobs is not None
        logprobs = seq.output_logprobs[sent:] if wants else None
        top = seq.output_top_logprobs[sent:] if wants else None
        prompt = prompt_top = None
        # On the first delta, once every position is scored (the first output token's step scores the last).
        if sent == 0 and seq.sampling_params.prompt_logprobs is not None and (
                len(seq.prompt_logprobs) == seq.num_prompt_tokens - 1):
            prompt, prompt_top = [None, *seq.prompt_logprobs], [None, *seq.prompt_top_logprobs]
        return RequestDelta(req.request_id, text, out_ids[sent:], logprobs, top, stats.token_times[sent:],
                            seq.finish_reason if finished else None, error, stats.first_scheduled_time,
                            stats.finished_time, seq.num_cached_tokens, prompt, prompt_top,
                            seq.stop_reason, error_is_input)

    def _assemble(self, deltas: list[RequestDelta]) -> list[RequestOutput]:
        outputs = []
        for delta in deltas:
            assembler = (self._assemblers.pop if delta.finished else self._assemblers.get)(delta.request_id, None)
            if assembler is not None:
                outputs.append(assembler.apply(delta))
        return outputs

    def warm_up(self) -> None:
        """Compile every kernel variant and capture the CUDA graphs (the runner's warm-up), then a
        prefill, decodes and sampling, so no request pays compilation time."""
        self.model_runner.warmup()
        self.add_request("warmup", prompt_token_ids=[1, 2, 3, 4],
                         sampling_params={"temperature": 0.0, "max_tokens": 4, "ignore_eos": True})
        while self.has_unfinished_requests():
            self.step()

    def close(self) -> None:
        """Stop what the model runner started (tensor-parallel workers); the engine is unusable after."""
        if self._grammars is not None:
            self._grammars.close()
        self.model_runner.close()

    # --- stats --------------------------------------------------------------------------------

    def get_stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_free=bm.num_free_blocks,
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_preemptions=self.scheduler.num_preemptions,
            num_prompt_tokens=self._num_prompt_tokens,
            num_cached_tokens=self.scheduler.num_cached_tokens,
            num_generation_tokens=self._num_generation_tokens,
            num_async_steps=self._num_async_steps,
        )


def start_engine(config: EngineConfig) -> LLMEngine:
    """An LLMEngine for config, warmed up; a failure stops what it started (tensor-parallel workers)."""
    engine = LLMEngine(config)
    try:
        engine.warm_up()
    except BaseException:
        engine.close()
        raise
    return engine
