"""The vLLM engine process: one in-process vLLM engine serving a policy's HF directory, driven over a zmq PAIR
socket in the project's wire format (rollout/wire.py: a JSON header + raw array frames, no pickle).

Run by the engine venv's python (`.ci/install-vllm`), never imported by the JAX side (this process has no JAX):

    $VENV/bin/python -m jaxwebrl.rollout.engines.vllm_process --address ipc:///tmp/x/engine --config '{...}'

Config (JSON): model_dir, regex (the action grammar as a structured output, or null), version (of the weights in
model_dir), seed, max_model_len, max_num_seqs, max_images, dtype, tensor_parallel_size, memory_fraction (of the
device's memory vLLM may take; on CPU, of host memory), enforce_eager (no torch.compile; the CPU default).

Messages in (header "op"):
  generate {"id"} + payload {prompt_ids [L] int32, images [[H, W, 3] uint8, ...], max_tokens, temperature, top_p,
           top_k, seed, regex (optional: this request's own structured output instead of the engine's)}: queued into the running engine at once (continuous batching; prefix caching on);
  push     payload {version, weights {hf_name: array}}: between two engine steps, the weights are reloaded in place
           and the encoder, multimodal and prefix caches reset; running requests resume with their generated
           prefix recomputed under the new weights, so a response may span versions (recorded per token): text-only
           ones are preempted by vLLM, ones with an image are aborted and resubmitted as prompt + prefix with the
           grammar's residual (`interrupt_image_requests`, `resume`: vLLM cannot encode a preempted image again);
  stats    -> {"op": "stats"} + counters; close: the process exits.
Messages out: ready {version, start_s}; result {"id"} + {tokens [N] int32, logprobs [N] float32 (processed: the
grammar-masked, temperature-scaled distribution each token was drawn from), versions [N] int32, finish_reason,
prompt_ids [L'] int32 (the prompt vLLM ran: one `<|image_pad|>` an image sent, expanded to the image's tokens)};
pushed {version, push_s}; error {"id", error}. A failure of the engine itself is one error line, then exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import zmq

from jaxwebrl.rollout.engines.regex_residual import residual_regex
from jaxwebrl.rollout.wire import decode_message, encode_message


def build_llm(config: dict):
    """The in-process vLLM engine for `config` (see the module docstring)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"   # in-process engine core: 4.7 s to start, not 18-32 s
    from vllm import LLM   # deferred heavy dependency: only this process (the engine venv) has vLLM

    _keep_cpu_weights_reloadable()
    max_len, max_seqs = int(config["max_model_len"]), int(config["max_num_seqs"])
    return LLM(model=config["model_dir"], dtype=config.get("dtype", "float32"), seed=int(config.get("seed", 0)),
               enable_prefix_caching=True, logprobs_mode="processed_logprobs", max_model_len=max_len,
               max_num_seqs=max_seqs,
               # a prefill is never chunked: per-request seeds with a chunked prefill kill the CPU engine
               max_num_batched_tokens=max_len * max_seqs,
               limit_mm_per_prompt={"image": int(config.get("max_images", 1)), "video": 0},
               tensor_parallel_size=int(config.get("tensor_parallel_size", 1)), disable_log_stats=False,
               # on the CPU backend the share of host memory vLLM reserves (its check refuses more than is free)
               gpu_memory_utilization=float(config.get("memory_fraction", 0.1)),
               enforce_eager=bool(config.get("enforce_eager", True)),   # no torch.compile: starts in seconds
               mm_device_do_normalize=False)   # the processor normalises the pixels, as the trainer's does


def _keep_cpu_weights_reloadable() -> None:
    """On the CPU backend, keep linear layers on plain `torch.nn.functional.linear` over their weight parameters.

    vLLM 0.32's CPU path packs each linear weight once at load into a oneDNN / sgl-kernel handle and drops the
    parameter; `reload_weights` then writes new values that the packed handles never see (measured: greedy tokens
    after a push were neither the old nor the new weights' argmax). Plain linear reads the parameters that the
    push overwrites in place; the tiny policies lose nothing measurable by it."""
    import torch   # deferred: the engine venv's torch
    from vllm.model_executor.layers import utils as layer_utils   # deferred: only the engine venv has vLLM
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or getattr(layer_utils, "_jaxwebrl_plain_linear", False):
        return
    packed = layer_utils.dispatch_cpu_unquantized_gemm

    def plain(layer, remove_weight: bool) -> None:
        if layer.weight.ndim != 2:   # conv and MoE weights: vLLM's own handling
            return packed(layer, remove_weight)
        layer.cpu_linear = torch.nn.functional.linear

    layer_utils.dispatch_cpu_unquantized_gemm = plain   # linear.py imports it at call time, so this one is used
    layer_utils._jaxwebrl_plain_linear = True


class EngineLoop:
    """Requests in flight on one engine, their tokens, processed log-probs and per-token weight versions."""

    def __init__(self, llm, regex: str | None, version: int):
        self.llm, self.engine = llm, llm.llm_engine
        self.regex, self.version = regex, int(version)
        self.live: dict[str, dict] = {}          # request id -> its record
        self.by_engine_id: dict[str, str] = {}   # vLLM's id of a request's current part -> the request id
        self.failed: list[tuple[str, str]] = []  # (request id, error) of requests that could not be resumed
        self.counters = {"requests": 0, "pushes": 0, "preempted_by_push": 0, "resubmitted_by_push": 0,
                         "generated_tokens": 0}

    def add(self, request_id: str, payload: dict) -> None:
        from PIL import Image   # deferred: the engine venv's Pillow

        images = [Image.fromarray(np.asarray(a, np.uint8)) for a in payload.get("images", [])]
        record = {"tokens": [], "logprobs": [], "versions": [], "images": images, "payload": payload,
                  "regex": payload.get("regex", self.regex), "parts": 0}
        self.live[request_id] = record
        self._submit(request_id, record, record["regex"])
        self.counters["requests"] += 1

    def _submit(self, request_id: str, record: dict, regex: str | None) -> None:
        """Queue the request's next part into the engine: its prompt and the tokens generated so far, the budget
        left, and `regex`: the grammar (a fresh request), or its residual after those tokens."""
        from vllm import SamplingParams   # deferred heavy dependency: only the engine venv has vLLM
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams   # (the same)

        payload, done = record["payload"], len(record["tokens"])
        seed = payload.get("seed")
        if seed is not None and done:   # a fresh stream: the first part's draws are not replayed
            seed = (int(seed) + 1_000_003 * done) % 2**31
        params = SamplingParams(
            n=1, max_tokens=int(payload["max_tokens"]) - done, temperature=float(payload["temperature"]),
            top_p=float(payload["top_p"]), top_k=int(payload["top_k"]), seed=seed, logprobs=0,
            detokenize=False, skip_special_tokens=False, output_kind=RequestOutputKind.DELTA,
            structured_outputs=StructuredOutputsParams(regex=regex) if regex else None)
        prompt: dict = {"prompt_token_ids": np.asarray(payload["prompt_ids"]).astype(int).tolist() + record["tokens"]}
        if record["images"]:
            prompt["multi_modal_data"] = {"image": record["images"]}
        record["engine_id"] = f"{request_id}#{record['parts']}" if record["parts"] else request_id
        record["parts"] += 1
        self.by_engine_id[record["engine_id"]] = request_id
        self.engine.add_request(record["engine_id"], prompt, params)

    def busy(self) -> bool:
        return bool(self.live)

    def step(self) -> list[tuple[str, dict]]:
        """One engine step; (id, result payload) of the requests that finished in it."""
        done = []
        for out in self.engine.step():
            request_id = self.by_engine_id.get(out.request_id)
            record = self.live.get(request_id) if request_id is not None else None
            if record is None or record["engine_id"] != out.request_id:
                continue   # an aborted part's last output
            completion = out.outputs[0]
            if out.prompt_token_ids is not None and "prompt_ids" not in record:   # the first part's: the prompt
                record["prompt_ids"] = np.asarray(out.prompt_token_ids, np.int32)   # after vLLM's expansion
            tokens = list(completion.token_ids)
            record["tokens"] += tokens
            record["logprobs"] += [entry[t].logprob for t, entry in zip(tokens, completion.logprobs or [])]
            record["versions"] += [self.version] * len(tokens)
            if out.finished:
                done.append(self._finish(request_id, str(completion.finish_reason)))
        return done

    def _finish(self, request_id: str, finish_reason: str) -> tuple[str, dict]:
        """(id, result payload) of a finished request, which leaves the live set."""
        record = self.live.pop(request_id)
        self.by_engine_id.pop(record["engine_id"], None)
        self.counters["generated_tokens"] += len(record["tokens"])
        return request_id, {
            "tokens": np.asarray(record["tokens"], np.int32),
            "logprobs": np.asarray(record["logprobs"], np.float32),
            "versions": np.asarray(record["versions"], np.int32),
            "prompt_ids": record.get("prompt_ids", np.zeros(0, np.int32)),
            "finish_reason": finish_reason}

    def interrupt_image_requests(self) -> list[str]:
        """Abort every request with an image in flight (before a push); their ids, for `resume` after it.

        vLLM keeps a request's image inputs only until it has encoded them, so a request with an image that a push
        preempts cannot be encoded again (the engine died: "Expected multimodal embeddings ..., but got NoneType").
        Such a request is aborted instead, and `resume` resubmits it whole: its images, its prompt and the tokens it
        generated, under the new weights."""
        aborted = [rid for rid, record in self.live.items() if record["images"]]
        if aborted:
            self.engine.abort_request([self.live[rid]["engine_id"] for rid in aborted])
        return aborted

    def resume(self, request_ids: list[str]) -> list[tuple[str, dict]]:
        """Resubmit the interrupted requests as prompt + generated prefix, with the budget and grammar left;
        (id, result) of those with nothing left to generate: the budget spent, or the grammar complete (then only
        the end token may follow, drawn with probability 1: log-prob 0, under the new version)."""
        done = []
        for request_id in request_ids:
            try:
                done += self._resume_one(request_id)
            except Exception as exc:  # noqa: BLE001 - this request fails alone (its caller hears why)
                self._finish(request_id, "error")
                self.failed.append((request_id, f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"))
        return done

    def _resume_one(self, request_id: str) -> list[tuple[str, dict]]:
        """`resume` for one request: [] once resubmitted, else its finished (id, result)."""
        record = self.live[request_id]
        left = int(record["payload"]["max_tokens"]) - len(record["tokens"])
        regex = record["regex"]
        if regex and record["tokens"]:
            regex = residual_regex(regex, self.llm.get_tokenizer().decode(record["tokens"]))
        if left > 0 and regex == "":
            record["tokens"].append(int(self.llm.get_tokenizer().eos_token_id))
            record["logprobs"].append(0.0)
            record["versions"].append(self.version)
            return [self._finish(request_id, "stop")]
        if left <= 0:
            return [self._finish(request_id, "length")]
        self.by_engine_id.pop(record["engine_id"], None)
        self._submit(request_id, record, regex)
        self.counters["resubmitted_by_push"] += 1
        return []

    def push(self, weights: dict, version: int) -> float:
        """Reload `weights` (HF names) in place, reset the three caches; seconds taken. Call it with no request
        with an image in flight (`interrupt_image_requests`)."""
        import torch   # deferred: the engine venv's torch

        start = time.perf_counter()
        tensors = [(name, torch.from_numpy(np.ascontiguousarray(array))) for name, array in weights.items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(tensors)})
        self.engine.reset_encoder_cache()   # without it a repeated image kills the engine ("Encoder cache miss")
        self.engine.reset_mm_cache()
        if not self.engine.reset_prefix_cache(reset_running_requests=True):   # else stale KV is reused silently
            raise RuntimeError("vLLM refused to reset its prefix cache after a weight push")
        self.counters["pushes"] += 1
        self.counters["preempted_by_push"] += len(self.live)
        self.version = int(version)
        return time.perf_counter() - start

    def stats(self) -> dict:
        out = dict(self.counters, version=self.version, running=len(self.live),
                   running_tokens=sum(len(record["tokens"]) for record in self.live.values()))
        try:
            for metric in self.llm.get_metrics():
                if metric.name in ("vllm:prefix_cache_queries", "vllm:prefix_cache_hits"):
                    out[metric.name.split(":")[1]] = float(metric.value)
        except Exception:  # noqa: BLE001 - metrics are best-effort diagnostics
            pass
        return out


def serve(socket, loop: EngineLoop) -> None:
    """Take every message waiting, step the engine while anything runs, until `close`."""
    while True:
        timeout = 0 if loop.busy() else 200
        while socket.poll(timeout):
            header, payload = decode_message(socket.recv_multipart(copy=False))
            op, request_id = header.get("op"), header.get("id")
            if op == "close":
                return
            try:
                if op == "generate":
                    loop.add(str(request_id), payload)
                elif op == "push":
                    interrupted = loop.interrupt_image_requests()
                    seconds = loop.push(payload["weights"], payload["version"])
                    socket.send_multipart(encode_message({"op": "pushed", "id": request_id},
                                                         {"version": loop.version, "push_s": seconds}))
                    _send_results(socket, loop.resume(interrupted))
                    for failed_id, error in loop.failed:
                        socket.send_multipart(encode_message({"op": "error", "id": failed_id, "error": error}, {}))
                    loop.failed.clear()
                elif op == "stats":
                    socket.send_multipart(encode_message({"op": "stats", "id": request_id}, loop.stats()))
                else:
                    raise ValueError(f"unknown op {op!r}: use generate, push, stats or close")
            except Exception as exc:  # noqa: BLE001 - the request fails alone, reported to its caller
                message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
                socket.send_multipart(encode_message({"op": "error", "id": request_id, "error": message}, {}))
            timeout = 0
        if loop.busy():
            _send_results(socket, loop.step())


def _send_results(socket, results: list[tuple[str, dict]]) -> None:
    """One `result` message for each (request id, result payload) of requests that finished."""
    for request_id, result in results:
        socket.send_multipart(encode_message({"op": "result", "id": request_id}, result))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", required=True, help="zmq endpoint to connect to (the JAX side binds it)")
    parser.add_argument("--config", required=True, help="engine config, JSON (see the module docstring)")
    args = parser.parse_args(argv)
    config = json.loads(args.config)
    context = zmq.Context.instance()
    socket = context.socket(zmq.PAIR)
    socket.setsockopt(zmq.LINGER, 1000)
    socket.connect(args.address)
    try:
        start = time.perf_counter()
        loop = EngineLoop(build_llm(config), config.get("regex"), int(config.get("version", 0)))
        socket.send_multipart(encode_message({"op": "ready"}, {"version": loop.version,
                                                               "start_s": time.perf_counter() - start}))
        serve(socket, loop)
    except Exception as exc:  # noqa: BLE001 - the engine died: one line to the JAX side, then exit 1
        message = f"{type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        socket.send_multipart(encode_message({"op": "fatal"}, {"error": message}))
        print(f"vllm_process: {message}", file=sys.stderr)
        return 1
    finally:
        socket.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
