"""Tokenizer: a local `tokenizer.json` (the `tokenizers` library) plus the model's Jinja chat template.

`Tokenizer.from_pretrained(hf_dir)` reads a Hugging Face checkpoint directory: `tokenizer.json`, and the chat
template from `chat_template.jinja`, `tokenizer_config.json["chat_template"]` or `chat_template.json` (the
same precedence transformers uses). The template is rendered in the same sandboxed Jinja environment as
transformers' `apply_chat_template` (trim_blocks, lstrip_blocks, loopcontrols, `raise_exception`, a `tojson`
that does not HTML-escape), so the rendered text is byte-identical to transformers'.

`tiny_tokenizer()` builds, in code and deterministically, the tokenizer of the `tiny` preset: a byte-level
BPE without merges (256 byte tokens) followed by the Qwen special tokens, 270 ids in all. It saves as a
normal `tokenizer.json` that transformers' `PreTrainedTokenizerFast` loads.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import Any, Mapping, Sequence

import numpy as np

# The Qwen special tokens. In the tiny vocabulary the four vision tokens come last, in the order
# image, video, vision start, vision end, so `tiny_config(vocab_size=270)` (whose vision ids default to the
# last four ids: image, video, start, end) lines up with `tiny_tokenizer()` without extra arguments.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<|vision_start|>",
    "<|vision_end|>",
)

# Chat template of the tiny preset, written for this project in the Qwen3-VL conversation format:
# `<|im_start|>{role}\n{content}<|im_end|>\n`, each image as `<|vision_start|><|image_pad|><|vision_end|>`,
# no default system prompt, and `<|im_start|>assistant\n` as the generation prompt.
TINY_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'video' or 'video' in part %}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in part %}"
    "{{- part['text'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

_SPECIAL_TOKEN_ATTRIBUTES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


def _compile_chat_template(template: str):
    """Compiles `template` in a sandboxed Jinja environment configured like transformers' chat templating."""
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        import jinja2.ext
    except ImportError as err:  # pragma: no cover - jinja2 ships with transformers
        raise ImportError("chat templates need jinja2>=3.1: pip install 'jinja2>=3.1.6'") from err

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    class GenerationTag(jinja2.ext.Extension):
        """Accepts `{% generation %}...{% endgeneration %}` blocks (used by some templates) and renders their body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_render_body"), [], [], body).set_lineno(lineno)

        def _render_body(self, caller):
            return caller()

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(template)


def _token_content(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json is a string or an AddedToken dict with "content"."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value


def _read_chat_template(hf_dir: str, tokenizer_config: Mapping[str, Any]) -> str | None:
    jinja_path = os.path.join(hf_dir, "chat_template.jinja")
    if os.path.exists(jinja_path):
        with open(jinja_path, encoding="utf-8") as f:
            return f.read()
    template = tokenizer_config.get("chat_template")
    if template is None:
        json_path = os.path.join(hf_dir, "chat_template.json")
        if os.path.exists(json_path):
            with open(json_path, encoding="utf-8") as f:
                template = json.load(f).get("chat_template")
    if isinstance(template, list):  # legacy multi-template format: [{"name": ..., "template": ...}]
        by_name = {entry["name"]: entry["template"] for entry in template}
        if "default" not in by_name:
            raise ValueError(f"{hf_dir}: chat_template lists {sorted(by_name)} but no 'default' template")
        template = by_name["default"]
    return template


class Tokenizer:
    """Text ↔ token ids with a chat template.

    Attributes:
      backend: the `tokenizers.Tokenizer`.
      chat_template: Jinja source, or None when the checkpoint ships none.
      special_tokens: {"eos_token": "<|im_end|>", "pad_token": ..., ...} as in tokenizer_config.json.
    """

    def __init__(self, backend, chat_template: str | None = None, special_tokens: Mapping[str, str] | None = None):
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self._compiled_template = None

    # ------------------------------------------------------------------ loading and saving
    @classmethod
    def from_pretrained(cls, hf_dir: str) -> "Tokenizer":
        """Loads `hf_dir/tokenizer.json` and the chat template; raises FileNotFoundError naming the missing file."""
        from tokenizers import Tokenizer as BackendTokenizer

        path = os.path.join(hf_dir, "tokenizer.json")
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"{path} not found: a checkpoint directory needs the fast-tokenizer file tokenizer.json "
                "(transformers writes it with tokenizer.save_pretrained(dir))"
            )
        backend = BackendTokenizer.from_file(path)
        config: dict[str, Any] = {}
        config_path = os.path.join(hf_dir, "tokenizer_config.json")
        if os.path.exists(config_path):
            with open(config_path, encoding="utf-8") as f:
                config = json.load(f)
        special = {name: _token_content(config.get(name)) for name in _SPECIAL_TOKEN_ATTRIBUTES}
        return cls(backend, _read_chat_template(hf_dir, config), special)

    def save_pretrained(self, out_dir: str) -> None:
        """Writes tokenizer.json, tokenizer_config.json and chat_template.jinja (transformers v5 layout)."""
        os.makedirs(out_dir, exist_ok=True)
        self.backend.save(os.path.join(out_dir, "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 262144,
            "clean_up_tokenization_spaces": False,
            **self.special_tokens,
        }
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
        if self.chat_template is not None:
            with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
                f.write(self.chat_template)

    # ------------------------------------------------------------------ vocabulary
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int:
        """Id of `token`; KeyError naming the token when the vocabulary lacks it."""
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise KeyError(f"token {token!r} is not in the vocabulary")
        return token_id

    def id_to_token(self, token_id: int) -> str:
        return self.backend.id_to_token(int(token_id))

    def token_strings(self, size: int | None = None) -> list[str | None]:
        """Each id's text, None for added (special) tokens and for ids past the vocabulary: `size` entries
        (default `vocab_size`; a model's embedding may be wider). What `TokenConstraint.from_regex` walks."""
        size = self.vocab_size if size is None else size
        added = set(self.backend.get_added_tokens_decoder())
        return [None if i in added or i >= self.vocab_size else self.backend.decode([i]) for i in range(size)]

    @property
    def eos_token_id(self) -> int | None:
        eos = self.special_tokens.get("eos_token")
        return None if eos is None else self.token_to_id(eos)

    @property
    def pad_token_id(self) -> int | None:
        pad = self.special_tokens.get("pad_token")
        return None if pad is None else self.token_to_id(pad)

    # ------------------------------------------------------------------ encode / decode
    def encode(self, text: str, add_special_tokens: bool = True) -> np.ndarray:
        """Text -> ids `[L] int32` (`add_special_tokens` runs the post-processor, as transformers does)."""
        return np.asarray(self.backend.encode(text, add_special_tokens=add_special_tokens).ids, dtype=np.int32)

    def decode(self, ids: Sequence[int] | np.ndarray, skip_special_tokens: bool = False) -> str:
        """Ids -> text."""
        return self.backend.decode([int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=skip_special_tokens)

    # ------------------------------------------------------------------ chat template
    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = False, **template_kwargs: Any
    ) -> str:
        """Renders HF-format `messages` to text exactly as transformers' `apply_chat_template(tokenize=False)`.

        `template_kwargs` reach the template as variables (e.g. `add_vision_id=True`, `tools=[...]`); the
        special tokens of tokenizer_config.json (`eos_token`, ...) are visible too, as in transformers.
        """
        if self.chat_template is None:
            raise ValueError(
                "this tokenizer has no chat template: add chat_template.jinja (or a 'chat_template' entry in "
                "tokenizer_config.json) to the checkpoint directory"
            )
        if self._compiled_template is None:
            self._compiled_template = _compile_chat_template(self.chat_template)
        variables = {**self.special_tokens, **template_kwargs}
        return self._compiled_template.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables
        )


def tiny_tokenizer() -> Tokenizer:
    """The `tiny` preset's tokenizer: 256 byte-level tokens (ids 0..255) then the Qwen special tokens.

    Deterministic and built without any download: `<|endoftext|>` = 256, `<|im_start|>` = 257, `<|im_end|>` = 258,
    ..., `<|image_pad|>` = 266, `<|video_pad|>` = 267, `<|vision_start|>` = 268, `<|vision_end|>` = 269; 270 ids.
    """
    from tokenizers import AddedToken, Tokenizer as BackendTokenizer, decoders, models, pre_tokenizers

    byte_alphabet = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for the bytes
    byte_symbols = sorted(byte_alphabet, key=lambda s: _byte_of_symbol(s))
    vocab = {symbol: index for index, symbol in enumerate(byte_symbols)}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False, byte_fallback=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIAL_TOKENS])
    special = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    return Tokenizer(backend, TINY_CHAT_TEMPLATE, special)


def _byte_of_symbol(symbol: str) -> int:
    """Inverse of GPT-2's bytes→unicode map: the byte a ByteLevel symbol stands for."""
    return _UNICODE_TO_BYTE[symbol]


def _build_unicode_to_byte() -> dict[str, int]:
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    codepoints = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codepoints.append(256 + extra)
            extra += 1
    return {chr(cp): byte for byte, cp in zip(printable, codepoints)}


_UNICODE_TO_BYTE = _build_unicode_to_byte()


@dataclasses.dataclass(frozen=True)
class VisionTokenIds:
    """Ids of the vision special tokens of a tokenizer."""

    vision_start: int
    vision_end: int
    image_pad: int
    video_pad: int

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> "VisionTokenIds":
        return cls(
            vision_start=tokenizer.token_to_id("<|vision_start|>"),
            vision_end=tokenizer.token_to_id("<|vision_end|>"),
            image_pad=tokenizer.token_to_id("<|image_pad|>"),
            video_pad=tokenizer.token_to_id("<|video_pad|>"),
        )
