"""The vision-language causal LM module shared by the Qwen-VL families (the tower is `config.family.vision_tower`).

Module call (this is the seam the sampler and trainer build on):

    logits, new_cache = module.apply({"params": params}, input_ids, attention_mask=None, position_ids=None,
                                     pixel_values=None, image_grid_thw=None, cache=None)

- input_ids [B, T] int; attention_mask [B, T] (1 = real token) or None (all real).
- position_ids [3, B, T] int or None. None: the rope index of this call's tokens (images laid out by
  `image_grid_thw`), shifted by cache["next_position"] when a cache is given, so decode positions continue
  after images correctly.
- pixel_values [N, C*T*P*P] and image_grid_thw [num_images, 3] in transformers' layout; the grid must be
  concrete (static under jit). Each run of image_token_id tokens receives one image's merged features.
- image_index [B, K] int32 or None. None: the images are bound to the image-token runs in batch-major order (the
  sampler's prompts). Given (the trainer's minibatches, where consecutive steps show the same screenshots):
  pixel_values / image_grid_thw hold each distinct image once, and row b's k-th image run shows image
  image_index[b, k] (-1: no image). The tower encodes each distinct image once; its features are gathered into
  every row that shows it (`gathered_image_slots`).
- image_features: the tower's output for pixel_values (`module.apply(..., method="encode_images")`), given instead
  of pixel_values (with the same image_grid_thw) when several calls share one encoding (the trainer's length groups).
- cache: from `kv_cache.init_cache`, or None for a plain full forward (new_cache is then None); fresh_cache=True
  says it is still empty and the left-padded prompts fill it (the sampler's prefill: the prompt attends only its
  own keys, on the model's attention kernel; `decoder.TextDecoder`).
- head: "all" -> logits [B, T, V] float32; "last" -> logits of the last position only [B, 1, V] (the sampler's
  prefill); "none" -> the final hidden states [B, T, E] instead of logits (the trainer's log-prob path,
  `lm_head.token_logprobs`, which never materialises the full logits).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxwebrl.models import lm_head, vision_layout
from jaxwebrl.models.config import ModelConfig
from jaxwebrl.models.decoder import TextDecoder, scatter_image_features
from jaxwebrl.models.rope_index import get_rope_index


class LMHead(nn.Module):
    """The untied head: weight [V, E], HF's `lm_head.weight` layout (a vocabulary chunk is a block of rows)."""

    vocab_size: int
    compute_dtype: jnp.dtype = jnp.float32
    param_dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, hidden):
        weight = self.param("weight", nn.initializers.normal(0.02), (self.vocab_size, hidden.shape[-1]),
                            self.param_dtype)
        return lm_head.head_logits(hidden, weight, self.compute_dtype)


class VisionLanguageModel(nn.Module):
    config: ModelConfig

    def setup(self):
        c = self.config
        kw = dict(dtype=jnp.dtype(c.dtype), param_dtype=jnp.dtype(c.base_param_dtype))   # LoRA: the frozen base's
        self.visual = c.family.vision_tower(c, **kw)
        self.language_model = TextDecoder(c.text, remat=c.remat, scan_layers=c.scan_layers,
                                          attention_chunk=c.attention_chunk, attention_impl=c.attention_impl,
                                          lora=c.lora, **kw)
        if not c.tie_word_embeddings:
            self.lm_head = LMHead(c.text.vocab_size, compute_dtype=kw["dtype"], param_dtype=kw["param_dtype"])

    def encode_images(self, pixel_values, image_grid_thw):
        """Vision tower output: (image_embeds [N', E], deepstack list of [N', E])."""
        return self.visual(pixel_values, image_grid_thw)

    def __call__(
        self,
        input_ids: jax.Array,
        attention_mask: jax.Array | None = None,
        position_ids: jax.Array | None = None,
        pixel_values: jax.Array | None = None,
        image_grid_thw=None,
        cache: dict | None = None,
        head: str = "all",
        image_index: jax.Array | None = None,
        image_features: tuple | None = None,
        fresh_cache: bool = False,
    ):
        c = self.config
        if head not in ("all", "last", "none"):
            raise ValueError(f"head={head!r}: use 'all', 'last' or 'none'")
        input_ids = jnp.asarray(input_ids, jnp.int32)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {input_ids.shape}")
        mask = jnp.ones(input_ids.shape, bool) if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
        embeds = self.language_model.embed(input_ids)
        deepstack, slots, rope_ids = (), None, input_ids
        grid = rope_grid = None
        if pixel_values is not None or image_features is not None:
            if image_grid_thw is None:
                raise ValueError("pixel_values was given without image_grid_thw; pass both (transformers layout)")
            grid = rope_grid = vision_layout.concrete_grid(image_grid_thw)
            image_embeds, deepstack = (self.encode_images(pixel_values, grid) if image_features is None
                                       else image_features)
            if image_index is None:
                check_image_tokens(input_ids, grid, c)
                slots = batch_order_image_slots(input_ids, c.image_token_id)
            else:
                slots, rope_grid = gathered_image_slots(input_ids, image_index, grid, c)
                # image tokens no image fills (sampled by the policy) are text, as the sampler decoded them
                rope_ids = jnp.where((input_ids == c.image_token_id) & (slots < 0), -1, input_ids)
                check_image_tokens(rope_ids, rope_grid, c)
            embeds = scatter_image_features(slots, image_embeds, embeds)
        if position_ids is None:
            position_ids, _ = get_rope_index(
                rope_ids,
                rope_grid,
                mask,
                image_token_id=c.image_token_id,
                spatial_merge_size=c.vision.spatial_merge_size,
            )
            if cache is not None:
                position_ids = position_ids + cache["next_position"][None, :, None]
        position_ids = jnp.asarray(position_ids, jnp.int32)
        hidden, new_cache = self.language_model(embeds, position_ids, mask, cache, tuple(deepstack), slots,
                                                fresh_cache=fresh_cache)
        if head == "none":
            return hidden, new_cache
        if head == "last":
            hidden = hidden[:, -1:]
        if c.tie_word_embeddings:
            weight = self.language_model.embed_tokens.embedding
            logits = lm_head.head_logits(hidden, weight, jnp.dtype(c.dtype))
        else:
            logits = self.lm_head(hidden)
        return logits.astype(jnp.float32), new_cache


def batch_order_image_slots(input_ids: jax.Array, image_token_id: int) -> jax.Array:
    """[B, T] int32: the i-th image token in batch-major order takes feature row i (-1 off image tokens)."""
    is_image = input_ids == image_token_id
    order = jnp.cumsum(is_image.reshape(-1)).reshape(is_image.shape) - 1
    return jnp.where(is_image, order, -1).astype(jnp.int32)


def gathered_image_slots(input_ids: jax.Array, image_index: jax.Array, grid: np.ndarray, config: ModelConfig):
    """Where each image token reads its feature when the images are given once each (`image_index`).

    input_ids [B, T] int; image_index [B, K] int32 (row b's k-th image run shows distinct image image_index[b, k],
    -1: none); grid [U, 3] concrete, the distinct images' patch grids (the tower's output holds image u's
    t*h*w / merge^2 features from `first_feature[u]` on). Returns (slots [B, T] int32: the feature row of every
    image token, -1 elsewhere and on a run no image fills (-1, or past the K-th: image tokens the policy sampled);
    occurrence grid [B*K, 3] int32: the grid of every image run in batch-major order, the runs first, for the rope
    index).
    """
    image_index = jnp.asarray(image_index, jnp.int32)
    merged = grid.prod(-1) // config.vision.spatial_merge_size**2
    first_feature = jnp.asarray(np.cumsum(merged) - merged, jnp.int32)                # [U]
    is_image = input_ids == config.image_token_id
    run_start = is_image & ~jnp.pad(is_image[:, :-1], ((0, 0), (1, 0)))
    run = jnp.cumsum(run_start, axis=1) - 1                                           # k of each token's run
    image = jnp.where(run < image_index.shape[1], jnp.take_along_axis(
        image_index, jnp.clip(run, 0, image_index.shape[1] - 1), axis=1), -1)        # [B, T] distinct image
    steps = jnp.arange(input_ids.shape[1], dtype=jnp.int32)
    within = steps - jax.lax.cummax(jnp.where(run_start, steps, -1), axis=1)          # offset inside the run
    slots = jnp.where(is_image & (image >= 0), first_feature[jnp.maximum(image, 0)] + within, -1)
    return slots.astype(jnp.int32), occurrence_grid_of(image_index, grid)


def occurrence_grid_of(image_index, grid: np.ndarray):
    """[B*K, 3] the grid of every image occurrence of image_index [B, K] in batch-major order, absent ones (-1)
    moved to the end (host array when image_index is concrete, else traced)."""
    try:
        index = np.asarray(image_index).reshape(-1)
    except Exception:  # traced
        index = jnp.asarray(image_index).reshape(-1)
        order = jnp.argsort(index < 0, stable=True)
        return jnp.asarray(grid, jnp.int32)[jnp.maximum(index[order], 0)]
    return grid[index[index >= 0]]


def check_image_tokens(input_ids, grid, config: ModelConfig) -> None:
    """When input_ids and grid are concrete, the image-token count must equal the merged patch count."""
    try:
        ids, grid = np.asarray(input_ids), np.asarray(grid)
    except Exception:  # traced: the caller is responsible
        return
    expected = int(grid.prod(-1).sum()) // config.vision.spatial_merge_size**2
    found = int((ids == config.image_token_id).sum())
    if found != expected:
        raise ValueError(
            f"input_ids hold {found} image tokens (id {config.image_token_id}) but image_grid_thw implies "
            f"{expected} merged patches; build input_ids with the processor that produced pixel_values"
        )
