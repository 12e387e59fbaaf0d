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
- cache: from `kv_cache.init_cache`, or None for a plain full forward (new_cache is then None).
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
    ):
        c = self.config
        if head not in ("all", "last", "none"):
            raise ValueError(f"head={head!r}: use 'all', 'last' or 'none'")
        input_ids = jnp.asarray(input_ids, jnp.int32)
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must be [B, T], got shape {input_ids.shape}")
        mask = jnp.ones(input_ids.shape, bool) if attention_mask is None else jnp.asarray(attention_mask).astype(bool)
        embeds = self.language_model.embed(input_ids)
        deepstack, is_image = (), None
        grid = None
        if pixel_values is not None:
            if image_grid_thw is None:
                raise ValueError("pixel_values was given without image_grid_thw; pass both (transformers layout)")
            grid = vision_layout.concrete_grid(image_grid_thw)
            check_image_tokens(input_ids, grid, c)
            image_embeds, deepstack = self.encode_images(pixel_values, grid)
            is_image = input_ids == c.image_token_id
            embeds = scatter_image_features(is_image, image_embeds, embeds)
        if position_ids is None:
            position_ids, _ = get_rope_index(
                input_ids,
                grid,
                mask,
                image_token_id=c.image_token_id,
                spatial_merge_size=c.vision.spatial_merge_size,
            )
            if cache is not None:
                position_ids = position_ids + cache["next_position"][None, :, None]
        position_ids = jnp.asarray(position_ids, jnp.int32)
        hidden, new_cache = self.language_model(embeds, position_ids, mask, cache, tuple(deepstack), is_image)
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


def check_image_tokens(input_ids, grid: np.ndarray, config: ModelConfig) -> None:
    """When input_ids are concrete, the image-token count must equal the merged patch count."""
    try:
        ids = np.asarray(input_ids)
    except Exception:  # traced: the caller is responsible
        return
    expected = int(grid.prod(-1).sum()) // config.vision.spatial_merge_size**2
    found = int((ids == config.image_token_id).sum())
    if found != expected:
        raise ValueError(
            f"input_ids hold {found} image tokens (id {config.image_token_id}) but image_grid_thw implies "
            f"{expected} merged patches; build input_ids with the processor that produced pixel_values"
        )
