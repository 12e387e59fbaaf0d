"""The policy server on a vLLM engine (`rollout.engine = "vllm"`): the same contract with workers as
`PolicyServer` (requests by reference, screenshots read from the ring buffer, replies with prompt and response
tokens, the behaviour log-prob of every sampled token, the version per token, timing), served by a vLLM engine in
its own process and venv (rollout/engines/: continuous batching, prefix caching, token ids in and out, the action
grammar as a regex structured output, processed log-probs).

    server = VllmPolicyServer.from_config(policy, buffer, config)   # PolicyService.for_policy picks it
    server.set_weights(params, version)    # JAX params -> HF names (the export mapping) -> every engine, now

Serving past one engine: `rollout.engine_replicas` engine processes (each `engine_tensor_parallel_size` devices)
behind the one server; each request goes to the replica with the fewest in flight, and a push goes to all of
them at once (the server's version is the one every replica holds).

What differs from the JAX server: no static batches (each request joins the running engine batch as soon as it
is taken from the queue; `server_max_batch` bounds the engine's concurrent sequences), and a weight push preempts
the running requests, which resume with their generated prefix recomputed under the new weights (AReaL's
interruptible generation), so a response may span versions and records that per token.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from jaxwebrl.env.agent.action_space import MemoryGrammar, config_memory_grammar, response_regex
from jaxwebrl.env.registry import config_action_texts
from jaxwebrl.models.hf_io import hf_arrays, save_pretrained
from jaxwebrl.rollout.engines.vllm_client import VllmEngine
from jaxwebrl.rollout.policy_server import PolicyServer, _settle

log = logging.getLogger(__name__)

# head_dims vLLM's CPU attention backend takes (it refuses the tiny preset's 16)
CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256)


class _Result(NamedTuple):
    """What `PolicyServer._reply` reads: prompt_ids [L], tokens [N], logprobs [N], versions [N]."""

    prompt_ids: np.ndarray
    tokens: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray


class VllmPolicyServer(PolicyServer):
    """`PolicyServer` whose generation is a vLLM engine process (see the module docstring)."""

    def __init__(self, policy, buffer, *, max_batch: int = 8, max_model_len: int = 1024, max_images: int = 1,
                 top_k: int = 0, action_texts: tuple[str, ...] | None = None, memory: MemoryGrammar | None = None,
                 seed: int = 0, group_size: int = 1, tensor_parallel_size: int = 1, replicas: int = 1):
        head_dim = policy.config.text.head_dim
        if head_dim not in CPU_HEAD_DIMS:
            raise ValueError(f"rollout.engine='vllm': vLLM's CPU attention takes head_dim in {CPU_HEAD_DIMS}, this "
                             f"policy has {head_dim}: use --config.model.name=tiny_hd32 for the tiny policy")
        self._engine_options = dict(max_model_len=int(max_model_len), max_num_seqs=int(max_batch),
                                    max_images=int(max_images), seed=int(seed),
                                    tensor_parallel_size=int(tensor_parallel_size))
        self._replicas = int(replicas)
        self._in_flight = [0] * self._replicas   # requests in flight on each engine
        self._flight_lock = threading.Lock()
        self._push_s: list[float] = []
        super().__init__(policy, buffer, max_batch=max_batch, deadline_ms=0.0, decode_chunk=1, top_k=top_k,
                         action_texts=action_texts, memory=memory, seed=seed, group_size=group_size)

    @classmethod
    def from_config(cls, policy, buffer, config) -> "VllmPolicyServer":
        r = config.rollout
        return cls(policy, buffer, max_batch=r.server_max_batch, max_model_len=config.buffer.max_seq_len,
                   max_images=config.env.prompt_window + 1, top_k=config.model.top_k,
                   action_texts=config_action_texts(config), memory=config_memory_grammar(config), seed=config.seed,
                   group_size=config.env.group_size,
                   tensor_parallel_size=r.engine_tensor_parallel_size, replicas=r.engine_replicas)

    # ------------------------------------------------------------------ engine
    def _make_sampler(self):
        """Start the engine on this policy's weights (an HF directory written once, the export's layout)."""
        self._model_dir = tempfile.mkdtemp(prefix="jaxwebrl-vllm-model-")
        try:
            save_pretrained(self.policy, self._model_dir)
            regex = response_regex(self.action_texts, self.memory) if self.action_texts else None
            self.engines: list[VllmEngine] = []

            def start(replica: int) -> VllmEngine:
                options = dict(self._engine_options, seed=self._engine_options["seed"] + replica)
                return VllmEngine(self._model_dir, regex=regex, version=self._version, **options)

            with ThreadPoolExecutor(self._replicas) as pool:   # the replicas start side by side
                futures = [pool.submit(start, replica) for replica in range(self._replicas)]
            for future in futures:   # every one waited for, so none is left running when another failed
                if future.exception() is None:
                    self.engines.append(future.result())
            for future in futures:
                future.result()   # raises the first start failure
            for replica, engine in enumerate(self.engines):
                log.info("vLLM engine started in %.1f s (replica %d of %d, log %s)", engine.start_s, replica + 1,
                         self._replicas, engine.log_path)
        except BaseException:
            for engine in getattr(self, "engines", []):
                engine.close()
            shutil.rmtree(self._model_dir, ignore_errors=True)
            raise
        return None

    def set_weights(self, params, version: int) -> None:
        """Publish `params` as `version` and push them into the engine now (HF names, the three cache resets);
        running requests resume under the new weights."""
        super().set_weights(params, version)
        weights = hf_arrays(self.policy.config, params)
        if len(self.engines) == 1:
            seconds = self.engines[0].push(weights, int(version))
        else:   # every replica at once; the push took as long as the slowest
            with ThreadPoolExecutor(len(self.engines)) as pool:
                seconds = max(pool.map(lambda engine: engine.push(weights, int(version)), self.engines))
        with self._stats_lock:
            self._push_s.append(seconds)

    def stats(self) -> dict:
        out = super().stats()
        with self._stats_lock:
            pushes = list(self._push_s)
        out.update(engine="vllm", pushes=len(pushes), push_s_mean=float(np.mean(pushes)) if pushes else 0.0,
                   engine_replicas=len(self.engines))
        return out

    def engine_stats(self) -> dict:
        """The engines' own counters (requests, pushes, prefix_cache_queries / prefix_cache_hits, ...), summed over
        the replicas; `replicas` lists each one's."""
        each = [engine.stats() for engine in self.engines]
        if len(each) == 1:
            return each[0]
        total = {k: sum(e.get(k, 0) for e in each) for k in each[0] if isinstance(each[0][k], (int, float))}
        total.update(version=min(e["version"] for e in each), replicas=each)
        return total

    def raise_if_failed(self) -> None:
        super().raise_if_failed()
        try:
            for engine in self.engines:
                engine.raise_if_failed()
        except RuntimeError as exc:
            raise RuntimeError(f"policy server stopped: {exc}") from None

    def close(self) -> None:
        try:
            super().close()
        finally:
            for engine in self.engines:
                engine.close()
            shutil.rmtree(self._model_dir, ignore_errors=True)

    # ------------------------------------------------------------------ batching thread
    def _serve(self) -> None:
        """Hand every queued request to the engine at once (it batches continuously); replies settle from the
        engine's I/O thread."""
        while not self._closed.is_set():
            for engine in self.engines:   # a dead engine ends this thread: handle() then fails at once
                engine.raise_if_failed()
            batch = self._next_batch()
            for request, future, queued_at in batch:
                try:
                    self._submit(request, future, queued_at)
                except Exception as exc:  # noqa: BLE001 - this request fails alone, its worker hears why
                    _settle(future, error=exc)
            if batch:
                with self._stats_lock:
                    self._stats["batches"] += 1

    def _submit(self, request: dict, future, queued_at: float) -> None:
        """Encodes `request` and hands it to the least loaded engine; the server is busy from here until the
        engine's reply (or the failure to submit it)."""
        self._busy.start()
        try:
            engine_future, done = self._encode_and_send(request, future, queued_at)
        except BaseException:
            self._busy.stop()
            raise
        engine_future.add_done_callback(done)   # done() ends the busy stretch this request began

    def _encode_and_send(self, request: dict, future, queued_at: float) -> tuple:
        """(the engine's future for `request`, the callback that settles `future` from it)."""
        start = time.monotonic()
        t0 = time.perf_counter()
        refs = np.asarray(request["image_refs"], np.int64).reshape(-1)
        images = [np.asarray(self.buffer.screenshots.get(int(r)), np.uint8) for r in refs]
        prompt = np.asarray(self.processor(request["messages"], images)["input_ids"], np.int32)
        seed = request.get("seed")
        payload = {"prompt_ids": collapse_image_tokens(prompt, self.processor.image_token_id), "images": images,
                   "max_tokens": int(request["max_new_tokens"]), "temperature": float(request.get("temperature", 1.0)),
                   "top_p": float(request.get("top_p", 1.0)), "top_k": self.top_k,
                   "seed": int(self._rng.integers(2**31 - 1)) if seed is None else int(seed)}
        t1 = time.perf_counter()
        with self._flight_lock:
            replica = int(np.argmin(self._in_flight))   # the least loaded engine
            self._in_flight[replica] += 1
            batch_size = self._in_flight[replica]
        timing = {"queue_s": start - queued_at, "encode_s": t1 - t0, "batch_size": batch_size, "compiled": False}

        def done(engine_future) -> None:
            self._busy.stop()
            with self._flight_lock:
                self._in_flight[replica] -= 1
            error = engine_future.exception()
            if error is not None:
                _settle(future, error=error)
                return
            result = engine_future.result()
            if not np.array_equal(result["prompt_ids"], prompt):
                _settle(future, error=RuntimeError(
                    f"vLLM expanded the prompt to {len(result['prompt_ids'])} tokens, the processor to {len(prompt)}: "
                    "its image processor disagrees with the policy's (compare the HF directory's "
                    "preprocessor_config.json)"))
                return
            reply = self._reply(_Result(prompt, result["tokens"], result["logprobs"], result["versions"]))
            reply["timing"] = dict(timing, compute_s=time.perf_counter() - t1)
            with self._stats_lock:
                policy_tokens = len(result["tokens"])
                self._stats["requests"] += 1
                self._stats["generated_tokens"] += policy_tokens
                self._stats["prompt_tokens"] += len(prompt)
            _settle(future, result=reply)

        try:
            return self.engines[replica].generate(payload), done
        except BaseException:   # never sent: no done() will come to take it off the engine's load
            with self._flight_lock:
                self._in_flight[replica] -= 1
            raise



def collapse_image_tokens(input_ids: np.ndarray, image_token_id: int) -> np.ndarray:
    """[L] -> [L'] int32: each run of `image_token_id` (one image's expanded tokens) as one token, the prompt vLLM
    takes with the images (it expands each placeholder itself; an expanded prompt would be expanded again)."""
    ids = np.asarray(input_ids, np.int32)
    is_pad = ids == image_token_id
    repeat = is_pad & np.concatenate([[False], is_pad[:-1]])
    return ids[~repeat]
