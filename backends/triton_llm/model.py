"""triton_llm: the llm_engine as a decoupled Triton model.

execute() only validates and hands each request to an asyncio loop thread; the engine's step
loop runs the continuous batch in a child process (engine_process, the default) or in a thread of
this stub, so execute() never waits for a generation. Each request ends with exactly one response
flagged FINAL: its last text, an error, or CANCELLED.
"""
from __future__ import annotations

import asyncio
import gc
import json
import os
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

from engine_settings import load_settings
from llm_request import INPUTS, OUTPUTS, InvalidRequest, LLMRequest, parse_request

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
CANCEL_CHECK_INTERVAL_S = 0.02


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
        version_dir = Path(args["model_repository"]) / args["model_version"]
        config, self.backend_settings = load_settings(self.model_config, version_dir)
        if self.backend_settings.get("triton_cache_dir"):
            # Compiled kernels persist across loads (a volume under docker-compose).
            os.environ["TRITON_CACHE_DIR"] = str(self.backend_settings["triton_cache_dir"])
        if args.get("model_instance_kind") == "GPU" and config.device in ("auto", "cuda"):
            config.device = f"cuda:{args['model_instance_device_id']}"

        from llm_engine.errors import EngineClosedError, EngineOverloadedError

        self._unavailable_errors = (EngineOverloadedError, EngineClosedError)  # EngineDeadError included
        if self.backend_settings["engine_process"]:
            from llm_engine.engine.process_client import EngineProcessClient
            # A child process owns the engine and its step loop, away from this process's GIL (each
            # response sent holds it for an IPC round trip); it warms up before this returns.
            self.engine = EngineProcessClient(config)
            where = f"in process {self.engine.pid}"
        else:
            from llm_engine.engine.async_engine import AsyncLLMEngine
            from llm_engine.engine.llm_engine import start_engine
            self.engine = AsyncLLMEngine(start_engine(config))  # warmed up before the model reports ready
            where = "in the stub"
        self.tokenizer = self.engine.tokenizer
        self.metrics = None
        try:
            from llm_metrics import LLMMetrics
            self.metrics = LLMMetrics({"model": args["model_name"], "version": args["model_version"]},
                                      self.engine.get_stats, self.backend_settings["metrics_interval_s"])
        except pb_utils.TritonModelException as exc:  # the server runs with metrics off
            pb_utils.Logger.log_info(f"triton_llm: metrics disabled ({exc})")
        self._tasks: set[asyncio.Future] = set()
        self._tasks_lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, name="triton_llm-responses",
                                             daemon=True)
        self._loop_thread.start()
        pb_utils.Logger.log_info(f"triton_llm: {config.model} ready on {config.device} ({where}), "
                                 f"{self.engine.get_stats().kv_blocks_total} KV blocks")

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                parsed = parse_request(lambda name: _input(request, name), request.parameters(),
                                       self.backend_settings["max_prompt_bytes"])
            except InvalidRequest as exc:
                sender.send(_error(str(exc), pb_utils.TritonError.INVALID_ARG), flags=FINAL)
                continue
            except Exception as exc:  # noqa: BLE001 - a parser bug must still end the request with a FINAL
                sender.send(_error(f"triton_llm: {type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL),
                            flags=FINAL)
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
        request_id = uuid.uuid4().hex
        try:
            prompt = (self.tokenizer.apply_chat_template(req.messages) if req.messages is not None
                      else req.prompt)
            stream = self.engine.add_request(request_id, prompt, req.sampling)
        except self._unavailable_errors as exc:
            sender.send(_error(str(exc), pb_utils.TritonError.UNAVAILABLE), flags=FINAL)
            return
        except ValueError as exc:
            sender.send(_error(str(exc), pb_utils.TritonError.INVALID_ARG), flags=FINAL)
            return
        except Exception as exc:  # noqa: BLE001 - anything else still owes the client a FINAL
            sender.send(_error(f"{type(exc).__name__}: {exc}", pb_utils.TritonError.INTERNAL), flags=FINAL)
            return

        cancelled = asyncio.Event()
        watcher = asyncio.ensure_future(self._watch_cancellation(sender, request_id, cancelled))
        out = None
        sent_tokens = 0
        first_token_seen = False
        next_cancel_check = 0.0
        try:
            async for out in stream:
                if not first_token_seen and out.token_ids:
                    first_token_seen = True
                    if self.metrics:
                        self.metrics.observe_first_token(out.stats.time_to_first_token)
                now = time.monotonic()
                # is_cancelled() is a round trip to the server process: ask at most every 20 ms.
                if now >= next_cancel_check and not cancelled.is_set():
                    next_cancel_check = now + CANCEL_CHECK_INTERVAL_S
                    if sender.is_cancelled():
                        cancelled.set()
                        self.engine.abort(request_id)  # freed before the engine's next step
                if out.finished or cancelled.is_set():
                    break
                if req.stream and out.delta_text:
                    sender.send(self._response(req, out, out.delta_text, len(out.token_ids) - sent_tokens))
                    sent_tokens = len(out.token_ids)
        except self._unavailable_errors as exc:  # the engine process died, or the queue filled up after all
            sender.send(_error(str(exc), pb_utils.TritonError.UNAVAILABLE), flags=FINAL)
            return
        except ValueError as exc:  # refused by the engine (e.g. more KV blocks than the pool holds)
            sender.send(_error(str(exc), pb_utils.TritonError.INVALID_ARG), flags=FINAL)
            return
        except Exception as exc:  # noqa: BLE001 - RequestFailedError or an engine failure
            sender.send(_error(str(exc), pb_utils.TritonError.INTERNAL), flags=FINAL)
            return
        finally:
            watcher.cancel()
        if cancelled.is_set():
            sender.send(_error("request cancelled by the client", pb_utils.TritonError.CANCELLED), flags=FINAL)
            return
        if self.metrics and out is not None:
            self.metrics.observe_finished(out.stats)
        if out is None or out.finish_reason == "abort":
            sender.send(_error("the model is being unloaded; request aborted", pb_utils.TritonError.UNAVAILABLE),
                        flags=FINAL)
            return
        if req.stream:
            text, n_tokens = out.delta_text, len(out.token_ids) - sent_tokens
        else:
            prefix = "" if req.exclude_input_in_output else (out.prompt or "")
            text, n_tokens = prefix + out.text, len(out.token_ids)
        sender.send(self._response(req, out, text, n_tokens, final=True), flags=FINAL)

    async def _watch_cancellation(self, sender, request_id: str, cancelled: asyncio.Event) -> None:
        """A request still waiting for the batch produces no outputs to check at; poll it."""
        while not cancelled.is_set():
            await asyncio.sleep(0.2)
            if sender.is_cancelled():
                cancelled.set()
                self.engine.abort(request_id)

    def _response(self, req: LLMRequest, out, text: str, n_tokens: int, final: bool = False):
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("finish_reason",
                            np.array([(out.finish_reason or "").encode() if final else b""], dtype=np.object_)),
        ]
        if req.return_num_input_tokens:
            tensors.append(pb_utils.Tensor("num_input_tokens",
                                           np.array([len(out.prompt_token_ids)], dtype=np.int32)))
        if req.return_num_output_tokens:
            # Streaming: tokens in this response (as vllm_backend); otherwise all output tokens.
            tensors.append(pb_utils.Tensor("num_output_tokens", np.array([n_tokens], dtype=np.int32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def finalize(self):
        """Let in-flight requests finish (up to shutdown_timeout_s), abort the rest with a final
        response each, then release the engine (its tensor-parallel workers stop) and its GPU memory."""
        timeout = self.backend_settings["shutdown_timeout_s"]
        pb_utils.Logger.log_info(f"triton_llm: finalize, waiting up to {timeout:.0f} s for in-flight requests")
        self.engine.shutdown(timeout=timeout)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the aborted requests' final responses go out
            with self._tasks_lock:
                if not self._tasks:
                    break
            time.sleep(0.05)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        if self.metrics:
            self.metrics.close()
        self.engine = self.tokenizer = self.metrics = None
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


def _error(message: str, code) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))

