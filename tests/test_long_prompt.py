"""Long prompts decode with the KV cache (the prefill runs in chunks, each mask block_size queries wide), and
streaming prints what --stream=off prints, an unfinished character included."""

import pytest
import torch
from helpers import TINY_BLOCK, TINY_RUN, skip_without_gpt2

import sample
import train
from generation import generate_cached
from model import GPT, GPTConfig
from plumbing.tokenizers import get_tokenizer
from positions import POS_SCHEMES

BLOCK = 8


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_a_prompt_of_ten_blocks_decodes_with_the_cache_as_without(pos):
    """A prompt 10 x block_size long: generate_cached (chunked prefill) gives the reference sampler's greedy
    tokens, for every scheme (learned: both see the last block_size tokens, its window)."""
    torch.manual_seed(0)
    model = GPT(
        GPTConfig.from_flat(n_layer=2, n_head=2, n_embd=16, block_size=BLOCK, vocab_size=11, pos=pos)
    ).eval()
    prompt = torch.randint(11, (2, 10 * BLOCK))
    cached = generate_cached(model, prompt, 2 * BLOCK, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 2 * BLOCK, temperature=0))


@pytest.mark.parametrize("max_context", [None, 5])
@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_a_long_prefill_builds_masks_of_a_chunk_of_queries_never_prompt_by_prompt(
    pos, max_context, monkeypatch
):
    """The largest (queries x keys) mask GPT.attention_mask builds while a 10 x block_size prompt decodes:
    block_size queries (or the window's) against the keys cached so far, never prompt x prompt."""
    config = GPTConfig.from_flat(n_layer=1, n_head=2, n_embd=16, block_size=BLOCK, vocab_size=11, pos=pos)
    model = GPT(config).eval()
    shapes, build = [], GPT.attention_mask

    def recorded(self, query_pos, cached=False):
        mask = build(self, query_pos, cached)
        if mask is not None:
            shapes.append(mask.shape[-2:])
        return mask

    monkeypatch.setattr(GPT, "attention_mask", recorded)
    n_prompt, new = 10 * BLOCK, 3
    generate_cached(model, torch.zeros(1, n_prompt, dtype=torch.long), new, max_context=max_context)
    queries, keys = max(shapes, key=lambda shape: shape[0] * shape[1])
    assert queries <= (max_context or BLOCK) and queries * keys < n_prompt * n_prompt / 4


def test_sample_decodes_a_file_prompt_of_ten_blocks_with_the_cache(tmp_path, capsys):
    """sample.py --start=FILE: with a prompt 10 x the trained length: the KV cache gives the tokens of
    --kv_cache=off."""
    out_dir = tmp_path / "run"
    train.main([*TINY_RUN, f"--out_dir={out_dir}"])
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("To be, or not to be: that is the question.\n" * (10 * TINY_BLOCK // 40 + 1))
    common = [f"--out_dir={out_dir}", f"--start=FILE:{prompt}", "--max_new_tokens=8", "--temperature=0"]
    _, cached, _ = sample.main([*common, "--device=cpu"])
    _, reference, _ = sample.main([*common, "--device=cpu", "--kv_cache=off"])
    assert len(cached[0]) > 10 * TINY_BLOCK and cached == reference


def test_streaming_prints_an_unfinished_character_as_stream_off_does(capsys):
    """The tokens of an emoji but its last: --stream=off decodes them to U+FFFD, and the streamer prints the
    same text once generation ends (it held the unfinished character back until then)."""
    skip_without_gpt2()
    tokenizer = get_tokenizer({"tokenizer": "gpt2"})
    prompt, emoji = tokenizer.encode("Hi"), tokenizer.encode(" \U0001f917")
    assert len(emoji) > 1 and tokenizer.decode(emoji[:-1]).endswith("\ufffd")
    streamer = sample.Streamer(tokenizer, prompt, block_size=2)
    for token in emoji[:-1]:
        streamer(torch.tensor([[token]]))
    streamer.close()
    expected = sample.mark_trained_length(tokenizer, prompt + emoji[:-1], 2)
    assert capsys.readouterr().out == expected and expected.endswith("\ufffd")
