"""triton_llm: the llm_engine as a decoupled Triton model.

execute() only validates and hands each request to an asyncio loop thread; the engine's step
loop runs the continuous batch in a child process (engine_process, the default) or in a thread of
this stub, so execute() never waits for a generation. Each request ends with exactly one response
flagged FINAL: its last text, an error, or CANCELLED.

Lifecycle: Triton finalizes an instance only once every request it holds has ended, and gives no
word of an unload before; a lifecycle thread watches the model's readiness instead (from the
server's HTTP endpoint, $RAGSTACK_TRITON_HTTP, which the launcher and the deployments set: the
Python backend's own readiness call, made from a thread, aborted Triton 2.51 with
boost::interprocess::lock_exception), and when it turns false (an unload, a server shutdown) lets
the open requests run for shutdown_timeout_s, ends the rest with UNAVAILABLE and stops the engine,
so the unload is bounded and the engine's memory returned. The watchdog (engine_supervisor.py)
restarts an engine that dies or hangs.
"""
from __future__ import annotations

import asyncio
import faulthandler
import gc
import json
import os
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from early_aborts import EarlyAborts
from engine_settings import load_settings
from chat_tools import for_template, template_info
from llm_request import (ABORT_KEY, INPUTS, OUTPUTS, InvalidRequest, LLMRequest, abort_key, asks_template_info,
                         parse_request)
from response_instances import check_thread_engine, engine_share, instances_on_device
from responses import ResponseBuilder
import tokenize_control

# Triton logs no word when a stub dies: a segfault here prints every thread's stack to the server log
faulthandler.enable()

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# is_cancelled() is a round trip to the server process, as each response sent is: each open stream
# is asked at most every 20 ms, and all of this instance's together at most 500 times a second (at
# 64 streams, each every 128 ms), so the checks never take more than a few percent of its sends'
# time (docs/benchmarks-journal.md, "The response path").
CANCEL_CHECK_INTERVAL_S = 0.02
MAX_CANCEL_CHECKS_PER_S = 500
READINESS_CHECK_INTERVAL_S = 0.5
READINESS_ENV = "RAGSTACK_TRITON_HTTP"  # host:port of the server's own HTTP endpoint
TASKS_DRAIN_S = 10.0  # for the responses of requests the shutdown ended


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        present = {t["name"] for t in config.as_dict().get("input", [])}
        for tensor in INPUTS:
            if tensor["name"] not in present:
                config.add_input(tensor)
        present = {t["name"] for t in config.as_dict().get("output", [])}
        for tensor in OUTPUTS:
            if tensor["name"] not in present:
                config.add_output(tensor)
        # The engine batches on its own (continuous batching) and streams: decoupled, no Triton batching.
        config.set_model_transaction_policy({"decoupled": True})
        config.set_max_batch_size(0)
        return config

    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(self.model_config):
            raise pb_utils.TritonModelException("triton_llm needs model_transaction_policy { decoupled: true }")
        self.name, self.version = args["model_name"], args["model_version"]
        version_dir = Path(args["model_repository"]) / self.version
        config, self.backend_settings, warnings = load_settings(self.model_config, version_dir)
        for warning in warnings:
            pb_utils.Logger.log_warn(f"triton_llm: {warning}")
        settings = self.backend_settings
        if settings.get("triton_cache_dir"):
            # Compiled kernels persist across loads (a volume under docker-compose).
            os.environ["TRITON_CACHE_DIR"] = str(settings["triton_cache_dir"])
        if args.get("model_instance_kind") == "GPU" and config.device in ("auto", "cuda"):
            config.device = f"cuda:{args['model_instance_device_id']}"

        from engine_supervisor import EngineSupervisor
        from llm_engine.errors import EngineClosedError, EngineDeadError, EngineOverloadedError

        self._unavailable_errors = (EngineOverloadedError, EngineClosedError)  # EngineDeadError included
        self._dead_error = EngineDeadError
        instances = instances_on_device(self.model_config, args.get("model_instance_kind", "MODEL"),
                                        int(args.get("model_instance_device_id", 0)))
        self._shared_engine = settings["engine_process"] and instances > 1
        if settings["engine_process"]:
            from llm_engine.engine.process_client import EngineProcessClient
            # A process of its own owns the engine and its step loop, away from this process's GIL
            # (each response sent waits for an IPC round trip); it warms up before it says it is
            # ready. The model's instances on this device share it (response_instances.py).
            share = engine_share(self.name, self.version, self.model_config, config, instances)
            start = lambda: EngineProcessClient(config, share=share, on_note=self._note)  # noqa: E731
            where = "in a process of its own"
            if instances > 1:
                where += f" shared by {instances} instances"
        else:
            check_thread_engine(instances)
            from llm_engine.engine.async_engine import AsyncLLMEngine
            from llm_engine.engine.llm_engine import start_engine
            start = lambda: AsyncLLMEngine(start_engine(config))  # noqa: E731
            where = "in the stub"
        self.supervisor = EngineSupervisor(start, restartable=settings["engine_process"],
                                           stall_timeout_s=settings["engine_stall_timeout_s"],
                                           max_restarts=settings["engine_max_restarts"], log=pb_utils.Logger.log_warn)
        self.tokenizer = self.supervisor.tokenizer
        self.max_model_len = config.max_model_len
        self.metrics = None
        try:
            from llm_metrics import LLMMetrics
            # The stub's pid keeps two live instances of one model (a reload, several instances) from
            # sharing a series: Triton 2.51 frees a series when either instance deletes it.
            labels = {"model": self.name, "version": self.version, "stub_pid": str(os.getpid())}
            self.metrics = LLMMetrics(labels, self.supervisor.get_stats, settings["metrics_interval_s"],
                                      config.max_model_len, exporter=self.supervisor.exports_engine_metrics)
        except pb_utils.TritonModelException as exc:  # the server runs with metrics off
            pb_utils.Logger.log_info(f"triton_llm: metrics disabled ({exc})")
        self._tasks: set[asyncio.Future] = set()
        self._tasks_lock = threading.Lock()
        self._by_cancel_key: dict[str, tuple] = {}  # CANCEL_KEY -> (engine, request id, cancelled event); loop thread only
        self._early_aborts = EarlyAborts()  # aborted keys whose request had not come; loop thread only
        self._open: dict[str, tuple] = {}  # request id -> (sender, engine, cancelled event); loop thread only
        self._finalizing = False
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="triton_llm-responses",
                                             daemon=True)
        self._loop_thread.start()
        self._sweeper = asyncio.run_coroutine_threadsafe(self._sweep_cancellations(), self.loop)
        self._unloading = threading.Event()
        self._lifecycle = threading.Thread(target=self._watch_readiness, name="triton_llm-lifecycle", daemon=True)
        self._lifecycle.start()
        pb_utils.Logger.log_info(f"triton_llm: {config.model} ready on {config.device} ({where}), "
                                 f"{self.supervisor.get_stats().kv_blocks_total} KV blocks")

    def execute(self, requests):
        # Every response goes out from the loop's thread: sends from two threads at once (execute's
        # and the loop's) aborted Triton 2.51 with boost::interprocess::lock_exception.
        for request in requests:
            sender = request.get_response_sender()
            key = abort_key(request.parameters())
            if key is not None:  # a caller of ours aborts a request it sent (Triton 2.51's BLS cannot)
                self.loop.call_soon_threadsafe(self._abort_by_key, key, sender)
                continue
            if asks_template_info(request.parameters()):  # the OpenAI frontend's, for tool_choice auto
                info = json.dumps(template_info(self.tokenizer.hf_tokenizer.chat_template)).encode()
                self.loop.call_soon_threadsafe(self._send, sender, _text_response(info), FINAL)
                continue
            get = lambda name, request=request: _input(request, name)  # noqa: E731
            try:
                # the OpenAI frontend's /tokenize and /detokenize, answered by the tokenizer alone
                answer = tokenize_control.answer(get, request.parameters(), self.tokenizer, self.max_model_len,
                                                 self.backend_settings["max_prompt_bytes"])
                parsed = parse_request(get, request.parameters(), self.backend_settings["max_prompt_bytes"]) \
                    if answer is None else None
            except InvalidRequest as exc:
                self.loop.call_soon_threadsafe(self._send, sender, _error(str(exc), pb_utils.TritonError.INVALID_ARG),
                                               FINAL)
                continue
            except Exception as exc:  # noqa: BLE001 - a parser bug must still end the request with a FINAL
                error = _error(f"triton_llm: {type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)
                self.loop.call_soon_threadsafe(self._send, sender, error, FINAL)
                continue
            if answer is not None:
                self.loop.call_soon_threadsafe(self._send, sender, _text_response(answer), FINAL)
                continue
            future = asyncio.run_coroutine_threadsafe(self._generate(parsed, sender), self.loop)
            with self._tasks_lock:
                self._tasks.add(future)
            future.add_done_callback(self._forget)
        return None

    def _forget(self, future):
        with self._tasks_lock:
            self._tasks.discard(future)

    async def _generate(self, req: LLMRequest, sender) -> None:
        if req.cancel_key is not None and self._early_aborts.take(req.cancel_key):
            self._fail(sender, req, "request cancelled by the client (aborted by its key before it arrived)",
                       pb_utils.TritonError.CANCELLED)
            return
        request_id = uuid.uuid4().hex
        try:
            engine = self.supervisor.engine()
            if req.messages is not None:
                messages = for_template(req.messages, self.tokenizer.hf_tokenizer.chat_template)
                prompt = self.tokenizer.apply_chat_template(messages, tools=req.tools, **req.chat_template_kwargs)
            else:
                prompt = req.prompt if req.prompt is not None else req.prompt_token_ids
            sampling = req.sampling
            if req.returns & {"return_cumulative_logprob", "return_logprobs"} and sampling.get("logprobs") is None:
                sampling = {**sampling, "logprobs": 0}  # the tokens' own logprobs, for those outputs
            if "return_prompt_logprobs" in req.returns and sampling.get("prompt_logprobs") is None:
                sampling = {**sampling, "prompt_logprobs": 0}
            stream = engine.add_request(request_id, prompt, sampling)
        except self._unavailable_errors as exc:
            self._fail(sender, req, self._explain(exc), pb_utils.TritonError.UNAVAILABLE)
            return
        except ValueError as exc:
            self._fail(sender, req, str(exc), pb_utils.TritonError.INVALID_ARG)
            return
        except Exception as exc:  # noqa: BLE001 - anything else still owes the client a FINAL
            self._fail(sender, req, f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL)
            return

        cancelled = asyncio.Event()
        if req.cancel_key is not None:
            self._by_cancel_key[req.cancel_key] = (engine, request_id, cancelled)
        self._open[request_id] = (sender, engine, cancelled)  # _sweep_cancellations asks its sender
        out = None
        builder = ResponseBuilder(req, self.tokenizer)
        first_token_seen = responded = False
        try:
            async for out in stream:
                if not first_token_seen and out.token_ids:
                    first_token_seen = True
                    if self.metrics:
                        self.metrics.observe_first_token(out.stats.time_to_first_token)
                if out.finished or cancelled.is_set():
                    break
                if req.stream and out.delta_text:
                    self._send(sender, builder.response(out, out.delta_text, final=False))
                    if not responded:
                        responded = True
                        self._observe_first_response(out)
        except self._unavailable_errors as exc:  # the engine died or hung, or the queue filled up after all
            self._fail(sender, req, self._explain(exc), pb_utils.TritonError.UNAVAILABLE)
            return
        except ValueError as exc:  # refused by the engine (e.g. more KV blocks than the pool holds)
            self._fail(sender, req, str(exc), pb_utils.TritonError.INVALID_ARG)
            return
        except Exception as exc:  # noqa: BLE001 - RequestFailedError or an engine failure
            self._fail(sender, req, str(exc), pb_utils.TritonError.INTERNAL)
            return
        finally:
            self._open.pop(request_id, None)
            self._by_cancel_key.pop(req.cancel_key, None)
        if cancelled.is_set():
            self._fail(sender, req, "request cancelled by the client", pb_utils.TritonError.CANCELLED)
            return
        if self.metrics and out is not None:
            self.metrics.observe_finished(out.stats)
        if out is None or out.finish_reason == "abort":
            self._fail(sender, req, "the model is being unloaded; request aborted", pb_utils.TritonError.UNAVAILABLE)
            return
        if req.stream:
            text = out.delta_text
        else:
            text = ("" if req.exclude_input_in_output else self._prompt_text(out)) + out.text
        self._send(sender, builder.response(out, text, final=True), FINAL)
        if not responded:
            self._observe_first_response(out)

    def _prompt_text(self, out) -> str:
        """The prompt as the answer repeats it: a prompt given as token ids, decoded."""
        return out.prompt if out.prompt is not None else self.tokenizer.decode(out.prompt_token_ids)

    def _observe_first_response(self, out) -> None:
        """From the request's arrival to its first response in Triton's hands (sent: the send has returned):
        the engine's TTFT plus this stub's relay."""
        if self.metrics:
            self.metrics.observe_first_response(time.monotonic() - out.stats.arrival_time)

    async def _sweep_cancellations(self) -> None:
        """Asks each open stream's sender whether its client cancelled, one after the other, each at
        most every CANCEL_CHECK_INTERVAL_S and all together at most MAX_CANCEL_CHECKS_PER_S times a
        second (running or waiting alike); a cancelled one is aborted, freed before the engine's next step."""
        while not self._finalizing:
            if not self._open:
                await asyncio.sleep(CANCEL_CHECK_INTERVAL_S)
                continue
            request_ids = list(self._open)
            pause = max(CANCEL_CHECK_INTERVAL_S / len(request_ids), 1.0 / MAX_CANCEL_CHECKS_PER_S)
            for request_id in request_ids:
                entry = self._open.get(request_id)
                if entry is not None and not entry[2].is_set() and entry[0].is_cancelled():
                    entry[2].set()
                    entry[1].abort(request_id)
                await asyncio.sleep(pause)

    def _abort_by_key(self, key: str, sender) -> None:
        """An abort lands on whichever instance Triton picks: the request's own instance may be another,
        so the key also goes to the engine's other clients (the instances sharing it, _note)."""
        if not self._abort_here(key) and self._shared_engine:
            try:
                self.supervisor.engine().send_note((ABORT_KEY, key))
            except self._unavailable_errors:
                pass   # restarting: the requests the old engine held are gone
        self._send(sender, None, FINAL)

    def _abort_here(self, key: str) -> bool:
        """Ends the request with this key, or keeps the key for the request should it come here later."""
        entry = self._by_cancel_key.get(key)
        if entry is None:
            self._early_aborts.add(key)
            return False
        engine, request_id, cancelled = entry
        cancelled.set()
        engine.abort(request_id)
        return True

    def _note(self, note) -> None:
        """Another instance's note, on the engine client's reader thread: an abort by key it got."""
        kind, key = note
        loop = getattr(self, "loop", None)  # notes can come while initialize has not made it yet
        if kind == ABORT_KEY and loop is not None:
            loop.call_soon_threadsafe(self._abort_here, key)

    def _fail(self, sender, req: LLMRequest, message: str, code) -> None:
        """End the request with an error: an error response, or for a caller that asks (our BLS
        callers, whom Triton 2.51 would not pass a late error response) a FINAL response whose
        `error` output holds it."""
        if not req.errors_in_band:
            self._send(sender, _error(message, code), FINAL)
            return
        error = json.dumps({"code": _code_name(code), "message": message}).encode()
        self._send(sender, pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("error", np.array([error], dtype=np.object_)),
            pb_utils.Tensor("finish_reason", np.array([b"error"], dtype=np.object_))]), FINAL)

    def _explain(self, exc: Exception) -> str:
        """An UNAVAILABLE error's message; an engine's death says what happens next."""
        if isinstance(exc, self._dead_error) and not self._unloading.is_set():
            return f"{exc}; {self.supervisor.recovery()}"
        return str(exc)

    def _send(self, sender, response, flags: int = 0) -> None:
        """Once the instance finalizes, its senders are Triton's no longer: nothing is sent."""
        if self._finalizing:
            return
        if response is None:
            sender.send(flags=flags)
        else:
            sender.send(response, flags=flags)

    def _watch_readiness(self) -> None:
        """Once the model was seen ready, its readiness turning false means an unload has begun."""
        server = os.environ.get(READINESS_ENV)
        if not server:
            pb_utils.Logger.log_info(f"triton_llm: ${READINESS_ENV} is not set: an unload waits for the open "
                                     "requests to end")
            return
        url = f"http://{server}/v2/models/{self.name}/versions/{self.version}/ready"
        seen_ready = False
        while not self._unloading.wait(READINESS_CHECK_INTERVAL_S):
            ready = _answers_ok(url)
            if ready is None:
                continue  # no answer this time (a busy server): ask again
            if ready:
                seen_ready = True
            elif seen_ready:
                timeout = self.backend_settings["shutdown_timeout_s"]
                pb_utils.Logger.log_info(f"triton_llm: {self.name} is unloading; open requests get up to "
                                         f"{timeout:.0f} s, then end with UNAVAILABLE")
                self._unloading.set()
                self._shut_down()
                return

    def _shut_down(self) -> None:
        """Requests run for up to shutdown_timeout_s, the rest are aborted (each gets its FINAL
        UNAVAILABLE), the engine stops and its process exits; then the responses go out."""
        self.supervisor.shutdown(timeout=self.backend_settings["shutdown_timeout_s"])
        deadline = time.monotonic() + TASKS_DRAIN_S
        while time.monotonic() < deadline:
            with self._tasks_lock:
                if not self._tasks:
                    return
            time.sleep(0.05)

    def finalize(self):
        """Every request has ended by now (Triton finalizes an instance after its last one): stop
        the engine if the unload's watcher has not, then the threads, and release the memory."""
        pb_utils.Logger.log_info("triton_llm: finalize")
        if not self._unloading.is_set():
            self._unloading.set()
            self._lifecycle.join()
            self._shut_down()
        else:
            self._lifecycle.join()
        self._finalizing = True
        try:
            self._sweeper.result(timeout=2)  # it returns within a pause (a pending task is reported at exit)
        except Exception:  # noqa: BLE001 - stuck or failed: the loop stops regardless
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        if self.metrics:
            self.metrics.close()
        self.supervisor = self.tokenizer = self.metrics = None
        gc.collect()
        try:
            import torch
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass


def _input(request, name: str):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _answers_ok(url: str) -> bool | None:
    """Whether GET `url` answers 200; None when it does not answer at all."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False
    except OSError:
        return None


def _code_name(code) -> str:
    """TritonError's name for a code (pb_utils.TritonError exists only once the stub runs the model)."""
    names = ("INVALID_ARG", "UNAVAILABLE", "CANCELLED", "INTERNAL")
    return next((name for name in names if getattr(pb_utils.TritonError, name) == code), "INTERNAL")


def _text_response(text: bytes) -> pb_utils.InferenceResponse:
    """A control request's answer: JSON in `text_output`."""
    tensor = pb_utils.Tensor("text_output", np.array([text], dtype=np.object_))
    return pb_utils.InferenceResponse(output_tensors=[tensor])


def _error(message: str, code) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
