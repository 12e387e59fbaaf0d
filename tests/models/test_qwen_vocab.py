"""The real Qwen vocabulary built offline from dashscope's qwen.tiktoken: published ids, round trips, rank-BPE
equivalence, transformers' fast tokenizer on the saved files, the Qwen3-VL chat template."""

import numpy as np
import pytest

pytest.importorskip("dashscope", reason="the Qwen BPE ranks ship in the dashscope wheel: pip install -e '.[qwen]'")

from jaxwebrl.models import qwen_vocab  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache = tmp_path_factory.mktemp("qwen_vocab")
    return qwen_vocab.qwen_tokenizer(cache_dir=str(cache)), cache


def test_published_ids(built):
    tok, _ = built
    # Qwen's own documentation of its ChatML prompt: "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    assert tok.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n").tolist() == [
        151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198]
    assert tok.encode("Hello world").tolist() == [9707, 1879]
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<|vision_start|>": 151652,
                "<|vision_end|>": 151653, "<|vision_pad|>": 151654, "<|image_pad|>": 151655, "<|video_pad|>": 151656,
                "<tool_call>": 151657, "</tool_call>": 151658, "<think>": 151667, "</think>": 151668}
    assert {t: tok.token_to_id(t) for t in expected} == expected
    assert tok.vocab_size == 151669 and tok.eos_token_id == 151645 and tok.pad_token_id == 151643
    assert tok.vocab_size <= qwen_vocab.QWEN_EMBEDDING_ROWS


TEXTS = [
    "Click the 'Submit' button, then type «naïve café» — 3.14 × 2 = 6.28!",
    "def click(x: int, y: int) -> None:\n\tprint(f\"clicked {x},{y}\")  # 注释\n",
    '<div class="nav"><a href="/login?next=%2Fhome">Log in</a>&nbsp;&amp;</div>\r\n',
    "日本語のテキスト、한국어 텍스트, текст на русском, نص عربي, emoji 🙂👍🏽 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "   leading spaces\n\n\ttabs\u00a0nbsp   trailing   ",
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [640, 360]}}\n</tool_call>',
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trips(built, text):
    tok, _ = built
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert (ids < tok.vocab_size).all()


def _rank_bpe(piece: bytes, ranks: dict) -> list[int]:
    """tiktoken's rule, written out: merge the adjacent pair whose concatenation has the lowest rank."""
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], float("inf")))
        if parts[best] + parts[best + 1] not in ranks:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return [ranks[p] for p in parts]


def test_merges_reproduce_rank_bpe(built):
    tok, _ = built
    ranks = qwen_vocab.read_ranks(qwen_vocab.rank_file())
    rng = np.random.default_rng(0)
    alphabet = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:'\"!?()[]{}<>/\\-_=+*&^%$#@\n\t"
                    "éüñçßøå中文字符日本語한국어абвгдежзийκλμνξοπρσ")
    texts = TEXTS[:-1] + [  # the last text holds added tokens, matched before BPE
        "".join(rng.choice(alphabet, rng.integers(5, 60))) for _ in range(150)]
    for text in texts:
        pieces = tok.backend.pre_tokenizer.pre_tokenize_str(tok.backend.normalizer.normalize_str(text))
        want = [i for piece, _ in pieces for i in _rank_bpe(qwen_vocab._symbols_to_bytes(piece), ranks)]
        assert tok.encode(text, add_special_tokens=False).tolist() == want, text


def test_cached_files_load_in_transformers_with_the_same_ids_and_template(built):
    from transformers import PreTrainedTokenizerFast

    tok, cache = built
    (directory,) = [p for p in cache.iterdir() if p.is_dir()]
    theirs = PreTrainedTokenizerFast.from_pretrained(str(directory))
    for text in TEXTS:
        assert theirs(text)["input_ids"] == tok.encode(text).tolist()
    assert theirs.eos_token == "<|im_end|>" and theirs.pad_token == "<|endoftext|>"
    messages = [
        {"role": "system", "content": "You are a web agent."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Goal: log in."}]},
        {"role": "assistant", "content": "", "tool_calls": [
            {"function": {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 2]}}}]},
        {"role": "tool", "content": "clicked"},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Next?"}]},
    ]
    tools = [{"type": "function", "function": {"name": "computer_use", "parameters": {"type": "object"}}}]
    for kwargs in ({}, {"tools": tools}):
        mine = tok.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
        assert mine == theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a web agent.<|im_end|>\n<|im_start|>user\n"
                           "<|vision_start|><|image_pad|><|vision_end|>Goal: log in.<|im_end|>\n")
    assert '<tool_call>\n{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [1, 2]}}\n' \
           "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nclicked\n</tool_response><|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n") and text.count("<|image_pad|>") == 2


def test_a_bad_rank_file_fails_in_one_line(tmp_path):
    bad = tmp_path / "qwen.tiktoken"
    bad.write_text("IQ== 0\nnot-a-line\n")
    with pytest.raises(ValueError, match="qwen.tiktoken:2: expected 'base64-token rank'"):
        qwen_vocab.read_ranks(str(bad))
