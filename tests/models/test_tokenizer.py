"""Tokenizer and chat template: equal to transformers' on tokenizers saved and loaded as HF directories."""

import json

import numpy as np
import pytest

from jaxwebrl.models.tokenizer import QWEN_SPECIAL_TOKENS, Tokenizer, tiny_tokenizer

transformers = pytest.importorskip("transformers")

CONVERSATIONS = [
    [{"role": "user", "content": "Click the OK button."}],
    [
        {"role": "system", "content": "You are a web agent. Answer with one action."},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Goal: type \"héllo wörld\" → submit"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "type(3, \"héllo\")"}]},
        {"role": "user", "content": [{"type": "text", "text": "next"}, {"type": "image"}, {"type": "image"}]},
    ],
]

# A template exercising what real Qwen templates use: namespaces, loop.first, a default system prompt,
# template kwargs (add_vision_id), tojson on tools, raise_exception, whitespace control.
RICH_TEMPLATE = """{%- set image_count = namespace(value=0) -%}
{%- if tools %}
<|im_start|>system
Tools: {{ tools | tojson }}<|im_end|>
{% endif %}
{%- for message in messages %}
    {%- if loop.first and message['role'] != 'system' %}
<|im_start|>system
Default prompt & <escapes>.<|im_end|>
{% endif %}
    {%- if message['role'] not in ['system', 'user', 'assistant'] %}
        {{- raise_exception('unknown role ' + message['role']) }}
    {%- endif %}
<|im_start|>{{ message['role'] }}
{% if message['content'] is string %}{{ message['content'] }}{% else %}
    {%- for part in message['content'] %}
        {%- if part['type'] == 'image' %}
            {%- set image_count.value = image_count.value + 1 %}
            {%- if add_vision_id %}Picture {{ image_count.value }}: {% endif -%}
<|vision_start|><|image_pad|><|vision_end|>
        {%- elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}
    {%- endfor %}
{%- endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def _trained_bpe(tmp_path):
    """A small byte-level BPE trained here, with the Qwen special tokens, saved as an HF directory."""
    from tokenizers import Tokenizer as BackendTokenizer, decoders, models, pre_tokenizers, trainers

    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(QWEN_SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = ["click the button", "type hello world into the field", "scroll down the page", "Goal: submit the form"]
    backend.train_from_iterator(corpus * 20, trainer=trainer)
    backend.save(str(tmp_path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
              "chat_template": RICH_TEMPLATE}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_tiny_tokenizer_layout_and_roundtrip():
    tok = tiny_tokenizer()
    assert tok.vocab_size == 256 + len(QWEN_SPECIAL_TOKENS) == 270
    assert list(tok.encode("AZ\n")) == [65, 90, 10]  # byte ids equal byte values
    assert tok.token_to_id("<|im_start|>") == 257 and tok.token_to_id("<|image_pad|>") == 266
    assert [tok.token_to_id(t) for t in ("<|video_pad|>", "<|vision_start|>", "<|vision_end|>")] == [267, 268, 269]
    assert tok.eos_token_id == 258 and tok.pad_token_id == 256
    text = "héllo <|im_start|>wörld 世界<|im_end|>"
    ids = tok.encode(text)
    assert ids.dtype == np.int32 and tok.decode(ids) == text
    assert tok.decode(ids, skip_special_tokens=True) == "héllo wörld 世界"
    assert list(tiny_tokenizer().encode(text)) == list(ids)  # deterministic
    with pytest.raises(KeyError, match="not in the vocabulary"):
        tok.token_to_id("<|nope|>")


def test_tiny_tokenizer_saves_as_hf_directory(tmp_path):
    tiny_tokenizer().save_pretrained(str(tmp_path))
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    ours = Tokenizer.from_pretrained(str(tmp_path))
    assert ours.vocab_size == len(hf) == 270
    assert hf.eos_token == "<|im_end|>" and hf.pad_token == "<|endoftext|>"
    for messages in CONVERSATIONS:
        for add_generation_prompt in (False, True):
            expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
            text = ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
            assert text == expected
            assert list(ours.encode(text)) == hf(text)["input_ids"]
            assert ours.decode(ours.encode(text)) == hf.decode(hf(text)["input_ids"])


def test_chat_template_equals_transformers_on_trained_bpe(tmp_path):
    hf_dir = str(_trained_bpe(tmp_path))
    hf = transformers.AutoTokenizer.from_pretrained(hf_dir)
    ours = Tokenizer.from_pretrained(hf_dir)
    tools = [{"name": "click", "description": "clicks <b>", "parameters": {"id": "int"}}]
    for messages in CONVERSATIONS:
        for kwargs in ({}, {"add_vision_id": True}, {"tools": tools}):
            expected = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
            text = ours.apply_chat_template(messages, add_generation_prompt=True, **kwargs)
            assert text == expected
            assert list(ours.encode(text)) == hf(text)["input_ids"]
    assert "Picture 2: " in ours.apply_chat_template(CONVERSATIONS[1], add_vision_id=True)
    with pytest.raises(Exception, match="unknown role robot"):
        ours.apply_chat_template([{"role": "robot", "content": "x"}])


def test_chat_template_file_precedence(tmp_path):
    hf_dir = _trained_bpe(tmp_path)
    (hf_dir / "chat_template.jinja").write_text("{% for m in messages %}[{{ m['role'] }}]{% endfor %}")
    ours = Tokenizer.from_pretrained(str(hf_dir))
    hf = transformers.AutoTokenizer.from_pretrained(str(hf_dir))
    messages = CONVERSATIONS[1]
    assert ours.apply_chat_template(messages) == hf.apply_chat_template(messages, tokenize=False) == "[system][user][assistant][user]"


def test_missing_files_give_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        Tokenizer.from_pretrained(str(tmp_path))
    tok = tiny_tokenizer()
    tok.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        tok.apply_chat_template(CONVERSATIONS[0])
