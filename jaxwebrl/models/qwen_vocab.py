"""The real Qwen vocabulary, offline: a Qwen3-VL tokenizer built from the byte-level BPE ranks a registry package
ships, saved as a normal `tokenizer.json` (transformers' fast tokenizer loads it).

Source: `qwen.tiktoken` inside the `dashscope` wheel (PyPI; `pip install -e ".[qwen]"`): the 151,643 byte-level BPE
tokens that Qwen2, Qwen2.5 and Qwen3 (and their VL models) share, one `base64(token bytes) rank` per line. The
tokenizer built from it:

- BPE model: the ranks as the vocabulary (bytes written with GPT-2's byte-to-unicode symbols), the merges derived
  from the ranks (every split of a token into two tokens, ordered by the merged token's rank: tiktoken's rule);
- Qwen's pre-tokenizer split regex, NFC normalisation, byte-level decoding;
- the special tokens at their published ids: 151643 `<|endoftext|>`, 151644 `<|im_start|>`, 151645 `<|im_end|>`,
  151646-151651 object/box/quad markers, 151652 `<|vision_start|>`, 151653 `<|vision_end|>`, 151654
  `<|vision_pad|>`, 151655 `<|image_pad|>`, 151656 `<|video_pad|>`; then the added text tokens 151657-151668
  (`<tool_call>` ... `</think>`); 151,669 ids in all (the model's embedding has 151,936 rows);
- a Qwen3-VL chat template (ChatML turns, `<|vision_start|><|image_pad|><|vision_end|>` per image, no default
  system prompt, tools listed in the system turn, tool results as `<tool_response>` user turns).

`qwen_tokenizer()` builds it once (a few seconds) and caches the files under `$JAXWEBRL_CACHE` (default
`~/.cache/jaxwebrl`), keyed by the hash of the rank file; nothing is committed, nothing is downloaded at run time.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os

from jaxwebrl.models.tokenizer import Tokenizer, _UNICODE_TO_BYTE

QWEN_VOCAB_SIZE = 151_643            # byte-level BPE tokens (ids 0 .. 151642)
QWEN_EMBEDDING_ROWS = 151_936        # rows of the Qwen3-VL embedding (the vocabulary padded)
# config.json's vision token ids in every published Qwen-VL checkpoint (the special tokens above)
QWEN_VISION_TOKEN_IDS = dict(image_token_id=151655, video_token_id=151656, vision_start_token_id=151652,
                             vision_end_token_id=151653)

# (content, special) in id order from 151643.
QWEN_ADDED_TOKENS = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True),
    ("<|object_ref_start|>", True), ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True),
    ("<|quad_start|>", True), ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True),
    ("<|vision_pad|>", True), ("<|image_pad|>", True), ("<|video_pad|>", True),
    ("<tool_call>", False), ("</tool_call>", False), ("<|fim_prefix|>", False), ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False), ("<|fim_pad|>", False), ("<|repo_name|>", False), ("<|file_sep|>", False),
    ("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False),
)

# Qwen's pre-tokenisation: contractions, letter runs (with one leading non-letter), single digits, punctuation runs,
# newlines, other whitespace.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Written for this project in the Qwen3-VL conversation format (see the module docstring).
QWEN3_VL_CHAT_TEMPLATE = (
    "{%- macro render(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- else -%}{%- for part in content -%}"
    "{%- if part['type'] == 'image' or 'image' in part or 'image_url' in part -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'video' or 'video' in part -%}"
    "{{- '<|vision_start|><|video_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in part -%}{{- part['text'] -}}"
    "{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- set first_system = messages and messages[0]['role'] == 'system' -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if first_system -%}{{- render(messages[0]['content']) + '\\n\\n' -}}{%- endif -%}"
    "{{- '# Tools\\n\\nFunction signatures, one JSON object per line:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nCall a function with its name and arguments as JSON inside <tool_call></tool_call> "
    "tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call>"
    "<|im_end|>\\n' -}}"
    "{%- elif first_system -%}"
    "{{- '<|im_start|>system\\n' + render(messages[0]['content']) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' and loop.first -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + render(message['content']) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] -%}{{- render(message['content']) -}}{%- endif -%}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] -%}"
    "{%- for call in message['tool_calls'] -%}"
    "{%- set call = call['function'] if 'function' in call else call -%}"
    "{%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' -}}"
    "{%- if call['arguments'] is string -%}{{- call['arguments'] -}}"
    "{%- else -%}{{- call['arguments'] | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

QWEN_SPECIAL_TOKEN_ATTRIBUTES = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}


def rank_file() -> str:
    """Path of `qwen.tiktoken` in the installed `dashscope` package (found without importing it)."""
    spec = importlib.util.find_spec("dashscope")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("the Qwen vocabulary comes from the dashscope package: pip install -e \".[qwen]\"")
    path = os.path.join(list(spec.submodule_search_locations)[0], "resources", "qwen.tiktoken")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: this dashscope version does not ship qwen.tiktoken; "
                                "pip install -e \".[qwen]\" installs the pinned one")
    return path


def read_ranks(path: str) -> dict[bytes, int]:
    """`base64 rank` lines -> {token bytes: rank}; ValueError naming the line when the file is not that format."""
    ranks: dict[bytes, int] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
            except ValueError as err:
                raise ValueError(f"{path}:{number}: expected 'base64-token rank', got {line[:60]!r}") from err
    return ranks


_BYTE_TO_UNICODE = {b: u for u, b in _UNICODE_TO_BYTE.items()}


def _symbols(token: bytes) -> str:
    return "".join(_BYTE_TO_UNICODE[b] for b in token)


def bpe_vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Byte-level vocabulary {symbols: id} and the merges that reproduce rank-ordered BPE (tiktoken's rule: merge
    the adjacent pair whose concatenation has the lowest rank): every split of a token into two tokens, ordered by
    the merged token's rank."""
    vocab = {_symbols(token): rank for token, rank in ranks.items()}
    merges: list[tuple[int, int, int, str, str]] = []
    for token, rank in ranks.items():
        if len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ranks and right in ranks:
                merges.append((rank, ranks[left], ranks[right], _symbols(left), _symbols(right)))
    merges.sort()
    return vocab, [(left, right) for _, _, _, left, right in merges]


def build_qwen_tokenizer(path: str | None = None) -> Tokenizer:
    """The Qwen3-VL tokenizer from the rank file (see the module docstring)."""
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
    from tokenizers import Tokenizer as BackendTokenizer

    ranks = read_ranks(path or rank_file())
    if len(ranks) != QWEN_VOCAB_SIZE or sorted(ranks.values()) != list(range(QWEN_VOCAB_SIZE)):
        raise ValueError(f"expected the {QWEN_VOCAB_SIZE} Qwen BPE ranks 0..{QWEN_VOCAB_SIZE - 1}, "
                         f"got {len(ranks)} entries")
    vocab, merges = bpe_vocab_and_merges(ranks)
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    for content, special in QWEN_ADDED_TOKENS:   # one at a time, so each gets the next id
        backend.add_tokens([AddedToken(content, special=special, normalized=False)])
    for i, (content, _) in enumerate(QWEN_ADDED_TOKENS):
        if backend.token_to_id(content) != QWEN_VOCAB_SIZE + i:
            raise AssertionError(f"{content} got id {backend.token_to_id(content)}, expected {QWEN_VOCAB_SIZE + i}")
    return Tokenizer(backend, QWEN3_VL_CHAT_TEMPLATE, dict(QWEN_SPECIAL_TOKEN_ATTRIBUTES))


def cache_root() -> str:
    return os.environ.get("JAXWEBRL_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jaxwebrl")


def qwen_tokenizer(cache_dir: str | None = None) -> Tokenizer:
    """The Qwen3-VL tokenizer, from the cache when it was built before (see the module docstring)."""
    path = rank_file()
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    out = os.path.join(cache_dir or cache_root(), f"qwen3_vl_tokenizer_{digest}")
    if os.path.isfile(os.path.join(out, "tokenizer.json")):
        return Tokenizer.from_pretrained(out)
    tokenizer = build_qwen_tokenizer(path)
    partial = f"{out}.tmp{os.getpid()}"
    tokenizer.save_pretrained(partial)
    try:
        os.replace(partial, out)          # atomic: a concurrent builder's copy is as good as ours
    except OSError:
        import shutil

        shutil.rmtree(partial, ignore_errors=True)
    return Tokenizer.from_pretrained(out)


def _symbols_to_bytes(symbols: str) -> bytes:
    """Inverse of `_symbols`: byte-level symbols -> the bytes they stand for."""
    return bytes(_UNICODE_TO_BYTE[s] for s in symbols)
