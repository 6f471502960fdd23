"""Python-based backend `onnxruntime`: serves `platform: "onnxruntime_onnx"` configs on the bundled
Triton 2.51, which lacks the native onnxruntime backend. Triton maps that platform to the backend
name "onnxruntime" and, finding no libtriton_onnxruntime.so, runs this file. The nvcr.io image
serves the same configs natively, so this file follows what the native backend does with them:
  - the model file is <version>/<default_model_filename, else model.onnx>;
  - config inputs and outputs must be the graph's, by name;
  - the requests of one dynamic batch (equal shapes but for the batch dimension, which Triton
    guarantees) run as one ONNX Runtime call;
  - parameters intra_op_thread_count / inter_op_thread_count (0: ONNX Runtime's default);
  - parameter memory.enable_memory_arena_shrinkage (e.g. "cpu:0"), a run option: the arena gives
    back what a run grew it by, where by default it keeps every peak (batches of varying shapes
    grew the reranker's stub by 100s of MiB per load round). Applied to runs of more than
    SHRINK_ABOVE_ELEMENTS values in an input only: a small run grows the arena by little, and the
    shrink cost a one-query embedder run 0.2-0.5 ms of its 1.5;
  - a KIND_GPU instance runs on its GPU through the CUDA execution provider.
Beyond the native backend, it refuses bad input with INVALID_ARG: requests breaking a graph's
recorded input contract (token_inputs.py), and whatever ONNX Runtime itself calls an invalid argument.
"""
import faulthandler
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument

import token_inputs

# Triton logs no word when a stub dies: a segfault here prints every thread's stack to the server log
faulthandler.enable()

SHRINK_ABOVE_ELEMENTS = 1024  # e.g. 16 texts of 64 tokens


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_thread_count", 0))
        options.inter_op_num_threads = int(params.get("inter_op_thread_count", 0))
        path = Path(args["model_repository"]) / args["model_version"] / (config.get("default_model_filename") or "model.onnx")
        self.session = ort.InferenceSession(str(path), options, providers=self._providers(args))
        self.run_options = ort.RunOptions()
        self.large_run_options = ort.RunOptions()
        shrink = params.get("memory.enable_memory_arena_shrinkage")
        if shrink:
            self.large_run_options.add_run_config_entry("memory.enable_memory_arena_shrinkage", shrink)
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        graph_inputs = {i.name for i in self.session.get_inputs()}
        graph_outputs = {o.name for o in self.session.get_outputs()}
        missing = sorted(set(self.outputs) - graph_outputs)
        if set(self.inputs) != graph_inputs or missing:
            raise pb_utils.TritonModelException(
                f"{path}: graph inputs {sorted(graph_inputs)} / outputs {sorted(graph_outputs)} do not match "
                f"config inputs {sorted(self.inputs)} / outputs {sorted(self.outputs)}"
                + (f"; the graph lacks {missing}: a version exported by an older scripts/export_onnx.py, export "
                   "it again" if missing else ""))
        self.batching = config.get("max_batch_size", 0) > 0
        self.limits = token_inputs.limits_of(self.session)

    @staticmethod
    def _providers(args):
        if args["model_instance_kind"] != "GPU":
            return ["CPUExecutionProvider"]
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise pb_utils.TritonModelException("a KIND_GPU instance needs onnxruntime-gpu (CUDAExecutionProvider)")
        return [("CUDAExecutionProvider", {"device_id": int(args["model_instance_device_id"])}), "CPUExecutionProvider"]

    def execute(self, requests):
        responses, feeds = [None] * len(requests), {}
        for i, request in enumerate(requests):
            try:
                feeds[i] = self._feed(request)
            except token_inputs.InvalidInput as error:  # refused alone; the rest of the batch runs
                responses[i] = _error(str(error), pb_utils.TritonError.INVALID_ARG)
        merged = self._run_merged(list(feeds.values())) if self.batching and len(feeds) > 1 else None
        for i, feed in feeds.items():
            responses[i] = next(merged) if merged is not None else self._run_alone(feed)
        return responses

    def _run_merged(self, feeds):
        """The requests of one dynamic batch as one ONNX Runtime call: an iterator of their responses,
        or None when the call fails, so that one bad request does not fail the others (each runs alone)."""
        try:
            merged = {name: np.concatenate([f[name] for f in feeds]) for name in self.inputs}
            results = self.session.run(self.outputs, merged, self._options(merged))
        except Exception:
            return None
        bounds = np.cumsum([0] + [len(feed[self.inputs[0]]) for feed in feeds])
        return iter([self._response([result[a:b] for result in results]) for a, b in zip(bounds[:-1], bounds[1:])])

    def _feed(self, request):
        feed = {name: pb_utils.get_input_tensor_by_name(request, name).as_numpy() for name in self.inputs}
        if self.limits is not None:
            token_inputs.check(feed, self.limits)
        return feed

    def _run_alone(self, feed):
        try:
            return self._response(self.session.run(self.outputs, feed, self._options(feed)))
        except InvalidArgument as error:
            return _error(f"onnxruntime: {error}", pb_utils.TritonError.INVALID_ARG)
        except Exception as error:
            return _error(f"onnxruntime: {error}", pb_utils.TritonError.INTERNAL)

    def _options(self, feed):
        large = max(array.size for array in feed.values()) > SHRINK_ABOVE_ELEMENTS
        return self.large_run_options if large else self.run_options

    def _response(self, results):
        return pb_utils.InferenceResponse([pb_utils.Tensor(name, result) for name, result in zip(self.outputs, results)])


def _error(message, code):
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))
