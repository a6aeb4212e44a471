"""sample.py as a user runs it: train tiny checkpoints with train.py,
then generate past their trained length."""

import json
import re
import shutil

import pytest
import torch
from helpers import TINY_BLOCK, TINY_RUN, error_line, skip_without_gpt2

import sample
import train
from lab.measure import losses
from plumbing.tokenizers import CharTokenizer, get_tokenizer, vocabulary_of
from positions import POS_SCHEMES

BLOCK = TINY_BLOCK
TINY = TINY_RUN


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One tiny checkpoint per position scheme, trained for two steps on the embedded shakespeare_char."""
    root = tmp_path_factory.mktemp("ckpts")
    out_dirs = {}
    for pos in POS_SCHEMES:
        out_dirs[pos] = str(root / pos)
        train.main(TINY + [f"--pos={pos}", f"--out_dir={out_dirs[pos]}"])
    return out_dirs


def run_sample(capsys, *flags):
    result = sample.main(list(flags))
    return result, capsys.readouterr().out


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_sample_generates_four_times_block_size_and_marks_the_crossing(checkpoints, capsys, pos):
    """With no length given every scheme generates 4 x block_size tokens, and the output marks where the
    trained length ends; a scheme with a length limit (learned) says its context is cropped."""
    (_, samples, _), out = run_sample(capsys, f"--out_dir={checkpoints[pos]}", "--start=ROMEO:")
    assert [len(ids) for ids in samples] == [len("ROMEO:") + 4 * BLOCK]
    assert out.count(f"[[trained length {BLOCK} ends here]]") == 1
    assert f"pos={pos}, trained length {BLOCK} tokens" in out
    limited = sample.load(checkpoints[pos], "cpu").model.length_limit is not None
    assert ("the context is cropped" in out) == limited


def test_streamed_text_equals_the_batch_text(checkpoints, capsys):
    """Streaming prints exactly the text that is generated, marker included."""
    flags = [f"--out_dir={checkpoints['rope']}", "--start=ROMEO:", "--max_new_tokens=40"]
    (loaded, streamed_ids, _), streamed = run_sample(capsys, *flags, "--stream=on")
    (_, batch_ids, _), batch = run_sample(capsys, *flags, "--stream=off")
    assert streamed_ids == batch_ids
    text = sample.mark_trained_length(loaded.tokenizer, batch_ids[0], BLOCK)
    assert text in streamed and text in batch


def streamed_text(capsys, tokenizer, ids, n_prompt, block_size, chunk_tokens=1):
    """What sample.Streamer prints when ids[n_prompt:] arrive one by one after the prompt ids[:n_prompt],
    read chunk_tokens at a time, until it is closed."""
    streamer = sample.Streamer(tokenizer, ids[:n_prompt], block_size, clock=lambda: 0.0)  # no time rule
    streamer.chunk_tokens = chunk_tokens
    for token in ids[n_prompt:]:
        streamer(torch.tensor([[token]]))
    streamer.close()
    return capsys.readouterr().out


@pytest.mark.parametrize("chunk_tokens", [1, 3, 32])
@pytest.mark.parametrize("tokenizer_name", ["char", "gpt2"])
def test_streamer_prints_the_marked_text_wherever_the_crossing_falls(capsys, tokenizer_name, chunk_tokens):
    """Read a token or a chunk at a time, the streamed text is mark_trained_length's for the whole sequence,
    for every prompt length and trained length, wherever a chunk ends; with GPT-2's BPE also where a token
    ends inside a multi-byte character (held back until the character is complete) and where the crossing
    falls inside one (both sides shown as decoded, as in the batch)."""
    text = "ROMEO: caf\u00e9, na\u00efve \u65e5\u672c\u8a9e \U0001f642!"
    if tokenizer_name == "char":
        tokenizer = get_tokenizer({"tokenizer": "char", "chars": sorted(set(text))})
    else:
        skip_without_gpt2()
        tokenizer = get_tokenizer({"tokenizer": "gpt2"})
    ids = tokenizer.encode(text)
    if tokenizer_name == "gpt2":  # the case this test is for: a token that is not a whole character
        assert any(tokenizer.decode([i]).endswith("\ufffd") for i in ids)
    prompts = [
        n for n in range(1, len(ids)) if not tokenizer.decode(ids[:n]).endswith("\ufffd")
    ]  # as encoded text
    for n_prompt in prompts:
        for block_size in range(1, len(ids) + 2):
            expected = sample.mark_trained_length(tokenizer, ids, block_size)
            assert streamed_text(capsys, tokenizer, ids, n_prompt, block_size, chunk_tokens) == expected, (
                n_prompt,
                block_size,
            )


def test_streaming_decodes_a_number_of_ids_linear_in_the_tokens(capsys):
    """Streaming n tokens decodes O(n) ids in all, not the whole text again per token (O(n^2): 20% of
    sample.py's time at 4,096 tokens)."""
    decoded = []

    class CountingTokenizer(CharTokenizer):
        def decode(self, ids):
            decoded.append(len(ids))
            return super().decode(ids)

    text = "ROMEO: what light through yonder window breaks? " * 8
    tokenizer = CountingTokenizer(sorted(set(text)))
    ids = tokenizer.encode(text)
    out = streamed_text(capsys, tokenizer, ids, 1, block_size=len(ids) // 2)
    assert out == sample.mark_trained_length(tokenizer, ids, len(ids) // 2)
    assert sum(decoded) <= 3 * len(ids)


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_greedy_text_is_the_same_with_and_without_kv_cache(checkpoints, capsys, pos):
    """--kv_cache=off runs the reference sampler; at temperature 0 both give the same tokens."""
    flags = [f"--out_dir={checkpoints[pos]}", "--temperature=0", "--max_new_tokens=48", "--stream=off"]
    (_, cached, _), _ = run_sample(capsys, *flags)
    (_, reference, _), _ = run_sample(capsys, *flags, "--kv_cache=off")
    assert cached == reference


def test_cuda_graph_off_is_accepted_and_a_cpu_decodes_eagerly(checkpoints, capsys):
    """--cuda_graph=off (the escape hatch on CUDA) changes nothing on a CPU, which decodes eagerly either way,
    and the tokens/s line says how the tokens were decoded: the decode loop's rate, the one-off setup before
    it (the prefill, the first step) beside it."""
    flags = [f"--out_dir={checkpoints['rope']}", "--temperature=0", "--max_new_tokens=24", "--stream=off"]
    (_, default, _), out = run_sample(capsys, *flags)
    (_, off, _), out_off = run_sample(capsys, *flags, "--cuda_graph=off")
    assert default == off
    speed = re.compile(
        r"\d+\.\d tokens/s \(KV cache\), after \d+\.\d\d s of setup \(prefill, the first step\)\n"
    )
    assert speed.search(out) and speed.search(out_off), out


@pytest.mark.parametrize("temperature", ["1e-45", "1e-30", "1e-300"])
def test_a_tiny_temperature_is_greedy(checkpoints, capsys, temperature):
    """Below float32's range for logits / temperature (1e-45: inf, 1e-300: 0/0), sampling is the most likely
    token, with the KV cache and without."""
    flags = [f"--out_dir={checkpoints['rope']}", "--max_new_tokens=48", "--stream=off", "--num_samples=2"]
    for cache in ("on", "off"):
        greedy = sample.main([*flags, f"--kv_cache={cache}", "--temperature=0"])[1]
        assert (
            sample.main([*flags, f"--kv_cache={cache}", f"--temperature={temperature}", "--seed=7"])[1]
            == greedy
        )


def test_same_seed_gives_the_same_samples_in_one_batch(checkpoints, capsys):
    """--num_samples are one batch; the same --seed reproduces them, another seed does not."""
    flags = [f"--out_dir={checkpoints['alibi']}", "--num_samples=3", "--max_new_tokens=30", "--top_p=0.9"]
    (_, first, _), _ = run_sample(capsys, *flags, "--seed=1")
    (_, again, _), _ = run_sample(capsys, *flags, "--seed=1")
    (_, other, _), _ = run_sample(capsys, *flags, "--seed=2")
    assert len(first) == 3 and first == again and first != other


def test_prompt_from_file(checkpoints, capsys, tmp_path):
    """--start=FILE:path reads the prompt from a file."""
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("KING RICHARD:\n", encoding="utf-8")
    (_, samples, _), _ = run_sample(
        capsys,
        f"--out_dir={checkpoints['none']}",
        f"--start=FILE:{prompt}",
        "--max_new_tokens=5",
        "--stream=off",
    )
    assert len(samples[0]) == len("KING RICHARD:\n") + 5


def test_prompt_with_characters_outside_the_vocabulary_is_a_clear_error(checkpoints, capsys):
    """A prompt character the model never saw is named in a one-line error, not a KeyError."""
    err = error_line(capsys, sample, [f"--out_dir={checkpoints['rope']}", "--start=café €5"], 1)
    assert re.search(r"error: characters not in the vocabulary: 'é', '€'", err)


def test_missing_and_corrupt_checkpoints_are_clear_errors(tmp_path, capsys):
    """No ckpt.pt, or a damaged one: a one-line error naming the file."""
    assert re.search(
        r"error: .*ckpt.pt: no such checkpoint file", error_line(capsys, sample, [f"--out_dir={tmp_path}"], 1)
    )
    (tmp_path / "ckpt.pt").write_bytes(b"not a checkpoint")
    err = error_line(capsys, sample, [f"--out_dir={tmp_path}"], 1)
    assert re.search(r"error: .*ckpt.pt: not a usable checkpoint \(UnpicklingError: ", err), err


def test_a_folder_named_ckpt_pt_is_named_a_folder_not_a_missing_file(tmp_path, capsys):
    """A folder where the checkpoint file belongs is said to be one: "no such file" would send the user
    looking for a file that is there, as a folder."""
    (tmp_path / "ckpt.pt").mkdir()
    err = error_line(capsys, sample, [f"--out_dir={tmp_path}"], 1)
    assert err.endswith(f"{tmp_path / 'ckpt.pt'}: a folder, not a checkpoint file"), err


@pytest.mark.parametrize(
    "flag, message",
    [
        ("--temperature=-1", "temperature must be >= 0"),
        ("--top_p=1.5", r"top_p must be in \(0, 1\]"),
        ("--rope_scaling=cubic", "invalid choice: 'cubic'"),
        ("--device=tpu", "choose from auto, cpu, cuda, cuda:N, mps"),
        ("--kv_cache=maybe", "expected a boolean"),
        ("--rope_factor=2", "rope_factor=2.0 needs rope_scaling"),
        (
            "--rope_high_freq_factor=8",
            "llama3's frequency factors, and this model has rope_scaling=None; give rope_scaling=llama3",
        ),
    ],
)
def test_bad_flags_are_one_line_errors(flag, message, capsys):
    """Every bad value is refused before anything loads, with the valid choices."""
    with pytest.raises(SystemExit):
        sample.main([flag])
    assert re.search(message, capsys.readouterr().err)


def test_rope_scaling_on_a_non_rope_checkpoint_is_a_clear_error(checkpoints, capsys):
    """--rope_scaling extends RoPE; asking it of an ALiBi model is an error that says so: the flag's mistake,
    status 2, as train.py gives it."""
    err = error_line(capsys, sample, [f"--out_dir={checkpoints['alibi']}", "--rope_scaling=yarn"], 2)
    assert re.search("rope_scaling='yarn' is a setting of pos=rope; this model has pos=alibi", err)


def test_rope_factor_defaults_to_generated_length_over_trained_length(checkpoints, capsys):
    """Without --rope_factor, s = (prompt + new tokens) / block_size: here (4 + 60) / 16 = 4."""
    (loaded, _, _), out = run_sample(
        capsys,
        f"--out_dir={checkpoints['rope']}",
        "--start=ABCD",
        "--max_new_tokens=60",
        "--rope_scaling=yarn",
        "--stream=off",
    )
    assert loaded.model.config.pos_settings.rope_factor == 4.0 and "rope scaling yarn x4" in out


def test_compare_runs_every_checkpoint_with_the_same_prompt_and_reports_speeds(checkpoints, capsys):
    """--compare: a header per model, the same settings for each, and a row per model with its speed."""
    dirs = [checkpoints[p] for p in ("learned", "rope", "alibi")]
    rows, out = run_sample(
        capsys, "--compare", *dirs, "--start=ROMEO:", "--seed=1", "--max_new_tokens=40", "--rope_scaling=ntk"
    )
    assert [f"=== {d} ===" in out for d in dirs] == [True] * 3
    assert [row[1].pos for row in rows] == ["learned", "rope", "alibi"]  # each model's GPTConfig
    scalings = [getattr(row[1].pos_settings, "rope_scaling", None) for row in rows]
    assert scalings == [None, "ntk", None]  # scaling applies to RoPE only
    assert all(tokens_per_second > 0 for _, _, tokens_per_second in rows)
    table = out.split("\ncheckpoint ")[-1].splitlines()[1:]
    assert [line.split()[:2] for line in table] == [[d, row[1].pos] for d, row in zip(dirs, rows)]


def test_compare_refuses_a_missing_checkpoint_before_sampling_any(checkpoints, capsys, monkeypatch, tmp_path):
    """A wrong path among --compare's is one line before the first model is sampled, not after it."""
    monkeypatch.setattr(sample, "print_samples", lambda *a, **k: pytest.fail("a model was sampled"))
    with pytest.raises(SystemExit):
        sample.main(["--compare", checkpoints["rope"], str(tmp_path / "typo")])
    out, err = capsys.readouterr()
    assert out == "" and err.endswith(f"{tmp_path / 'typo' / 'ckpt.pt'}: no such checkpoint file\n"), err


def test_a_loaded_model_holds_the_only_copy_of_its_weights(checkpoints):
    """sample.load keeps the checkpoint's configs, meta and progress beside the model, not its weights or
    optimizer state: the model holds the weights, once."""
    loaded = sample.load(checkpoints["rope"], "cpu")
    assert {"model_config", "meta", "train_config", "iter_num"} <= loaded.checkpoint.keys()
    assert not [
        key
        for key, value in loaded.checkpoint.items()
        if isinstance(value, dict) and any(isinstance(v, torch.Tensor) for v in value.values())
    ]
    assert "model" not in loaded.checkpoint and "optimizer" not in loaded.checkpoint


def test_no_losses_are_measured_for_a_checkpoint_without_a_dataset(checkpoints):
    """OpenAI's GPT-2 (--init_from=gpt2) comes with no training dataset to evaluate on: its losses inside and
    beyond T (lab.measure.losses) are missing, not a KeyError."""
    loaded = sample.load(checkpoints["rope"], "cpu")
    # a GPT2_MODELS name's checkpoint info, once loaded: its model config and meta, no training config
    info = {key: loaded.checkpoint[key] for key in ("model_config", "meta")}
    pretrained = sample.Loaded(loaded.model, loaded.tokenizer, info)
    dataset = lambda loaded: loaded.checkpoint.get("train_config", {}).get(
        "dataset"
    )  # as a checkpoint records it
    assert losses.inside_vs_beyond_loss(pretrained.model, dataset(pretrained), "cpu", 2 * BLOCK) is None
    assert losses.inside_vs_beyond_loss(loaded.model, dataset(loaded), "cpu", 2 * BLOCK) is not None


def test_learned_position_losses_beyond_the_table_use_the_sliding_window(checkpoints):
    """Past block_size, learned's loss at position p comes from the window of the block_size tokens ending at
    p, the same context its generator uses."""
    loaded = sample.load(checkpoints["learned"], "cpu")
    x = torch.randint(0, 65, (2, 3 * BLOCK), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 65, (2, 3 * BLOCK), generator=torch.Generator().manual_seed(1))
    per_position = losses.position_losses(loaded.model, x, y)
    p = 2 * BLOCK + 5
    logits, _ = loaded.model(x[:, p - BLOCK + 1 : p + 1])
    expected = torch.nn.functional.cross_entropy(logits[:, -1], y[:, p])
    torch.testing.assert_close(per_position[p], expected, rtol=1e-5, atol=1e-6)


def test_sample_prefers_the_best_checkpoint_over_the_latest(checkpoints, tmp_path):
    """train.py keeps best.pt (lowest val loss) beside ckpt.pt (latest):
    sampling uses best.pt when it exists."""
    shutil.copy(f"{checkpoints['learned']}/ckpt.pt", tmp_path / "ckpt.pt")
    assert sample.load(tmp_path, "cpu").model.config.pos == "learned"
    shutil.copy(f"{checkpoints['alibi']}/ckpt.pt", tmp_path / "best.pt")
    assert sample.load(tmp_path, "cpu").model.config.pos == "alibi"


def test_gpt2_bpe_dataset_trains_and_samples_offline(tmp_path, capsys):
    """The BPE Shakespeare: train.py prepares it, trains on its 50257-id vocabulary, and sample.py decodes
    GPT-2 tokens (offline with TIKTOKEN_CACHE_DIR set; skipped when the encoding cannot be loaded)."""
    skip_without_gpt2()
    out_dir = tmp_path / "bpe"
    result = train.main(TINY + ["--dataset=shakespeare", "--pos=rope", f"--out_dir={out_dir}"])
    assert result["best_val_loss"] < 11  # about ln(50257) = 10.8 at initialisation
    (loaded, samples, _), out = run_sample(
        capsys, f"--out_dir={out_dir}", "--start=ROMEO:", "--max_new_tokens=20"
    )
    assert loaded.tokenizer.name == "gpt2" and loaded.model.config.vocab_size == 50257
    assert len(samples[0]) == len(loaded.tokenizer.encode("ROMEO:")) + 20
    assert "pos=rope, trained length 16 tokens" in out and "ROMEO:" in out


def test_compiled_decoding_gives_the_same_greedy_text(checkpoints, capsys):
    """sample.py --compile runs the decode step through torch.compile (inductor on CPU) and gives the tokens
    of the uncompiled cached sampler; --compile without the cache is a one-line error."""
    flags = [f"--out_dir={checkpoints['rope']}", "--temperature=0", "--max_new_tokens=24", "--stream=off"]
    (_, plain, _), _ = run_sample(capsys, *flags)
    (_, compiled, _), out = run_sample(capsys, *flags, "--compile")
    assert compiled == plain and "compiled KV cache" in out
    with pytest.raises(SystemExit):
        sample.main([*flags, "--compile", "--kv_cache=off"])
    assert "--compile compiles the KV-cached decode step" in capsys.readouterr().err


def damaged(out_dir, tmp_path, change, name="damaged"):
    """A copy of out_dir's ckpt.pt, read as torch.load(weights_only=True) reads it, change(ckpt) applied,
    saved in its own folder: a damaged file as a user meets one. -> the folder"""
    ckpt = torch.load(f"{out_dir}/ckpt.pt", weights_only=True)
    change(ckpt)
    (tmp_path / name).mkdir()
    torch.save(ckpt, tmp_path / name / "ckpt.pt")
    return tmp_path / name


@pytest.mark.parametrize(
    "chars, words",
    [
        (["a"] * 65, "chars repeats 'a': a character would have several ids"),
        (list("abc"), "chars has 3, too few"),
        (list("abc") * 30, "chars has 90, too many"),
        ([1] * 65, "chars holds 1, not one character"),
        ({"a": 0}, "chars is a dict, not a list"),
        (None, "chars is missing"),
    ],
    ids=["repeated", "too-few", "too-many", "not-strings", "not-a-list", "missing"],
)
def test_a_char_vocabulary_says_what_is_wrong_with_its_characters(chars, words):
    """vocabulary_of, the one rule for a dataset's meta.json and a checkpoint's meta: a char vocabulary
    is vocab_size characters, each once (a repeated one makes a text's ids a guess), and each way one is not
    is named, after what is needed."""
    meta = {"tokenizer": "char", "vocab_size": 65} | ({} if chars is None else {"chars": chars})
    with pytest.raises(ValueError) as error:
        vocabulary_of(meta)
    why = str(error.value)
    assert why.startswith("a char tokenizer needs chars, the 65 characters") and words in why, why
    chars = [chr(32 + i) for i in range(65)]
    assert vocabulary_of(meta | {"chars": chars}) == ("char", 65, chars)


def test_a_checkpoint_whose_characters_repeat_is_refused_in_one_line(checkpoints, capsys, tmp_path):
    """A checkpoint whose meta repeats a character (65 x 'a') is refused when opened, naming the file and
    the repeat, whatever the prompt: not accepted until a prompt happens to need another character."""
    folder = damaged(checkpoints["rope"], tmp_path, lambda c: c["meta"].__setitem__("chars", ["a"] * 65))
    err = error_line(capsys, sample, [f"--out_dir={folder}", "--start=aaa", "--max_new_tokens=2"], 1)
    assert f"{folder / 'ckpt.pt'}: " in err and "chars repeats 'a'" in err, err


def scaled(name, factor):
    return lambda ckpt: ckpt["model"][name].mul_(factor)


OVERFLOWING = [  # (scheme, change): finite weights whose forward overflows
    ("rope", scaled("transformer.h.0.attn.c_attn.weight", 1e30)),
    ("rope", scaled("transformer.wte.weight", 1e36)),
    ("fire", lambda ckpt: ckpt["model"]["transformer.wpe.c_log"].fill_(1000.0)),
]


@pytest.mark.parametrize(
    "flags", [[], ["--kv_cache=off"], ["--temperature=0"], ["--kv_cache=off", "--temperature=0"]]
)
@pytest.mark.parametrize("pos, change", OVERFLOWING, ids=["attention", "embedding", "fire-c_log"])
def test_a_checkpoint_whose_logits_overflow_is_one_line(checkpoints, capsys, tmp_path, pos, change, flags):
    """A checkpoint of finite weights that overflow in the forward pass (x 1e30, FIRE's c_log = 1000) passes
    the open-time finite-weights check; sampling from it is one line naming the file, status 1, with the KV
    cache or without, sampled or greedy: not torch.multinomial's traceback, nor garbage and status 0."""
    folder = damaged(checkpoints[pos], tmp_path, change)
    err = error_line(capsys, sample, [f"--out_dir={folder}", "--max_new_tokens=8", "--stream=off", *flags], 1)
    assert f"{folder / 'ckpt.pt'}: the model's logits are not finite (NaN or inf)" in err, err
    assert "a diverged or damaged checkpoint" in err, err


def write_factors(tmp_path, name, short, long):
    (tmp_path / name).write_text(json.dumps({"short_factor": short, "long_factor": long}))
    return tmp_path / name


@pytest.mark.parametrize(
    "pos, flags, words",
    [
        ("rope", ["--rope_factors={half}"], "rope_long_factor must be in [1, inf), got [0.5, 1, 1, 1]"),
        (
            "rope",
            ["--rope_factors={few}"],
            "--rope_factors={few} on {out_dir}: rope_short_factor has 2 factors",
        ),
        (
            "fire",
            ["--rope_scaling=yarn"],
            "--rope_scaling=yarn on {out_dir}: rope_scaling='yarn' is a setting of",
        ),
        ("fire", ["--rope_factors={few}"], "--rope_factors={few} on {out_dir}: rope_scaling='longrope' is a"),
    ],
    ids=["factor-below-1", "factors-of-another-count", "scaling-on-fire", "factors-on-fire"],
)
def test_a_rope_flag_the_checkpoint_refuses_is_the_flags_mistake(
    checkpoints, capsys, tmp_path, pos, flags, words
):
    """A --rope_* flag or --rope_factors file whose settings the checkpoint's model refuses (a factor below 1,
    the wrong count, any RoPE setting on a scheme without RoPE) is the user's mistake: status 2, naming the
    flag or file, not blamed on the checkpoint (status 1, its path first)."""
    files = dict(
        half=write_factors(tmp_path, "half.json", [1] * 4, [0.5, 1, 1, 1]),
        few=write_factors(tmp_path, "few.json", [1, 1], [1, 1]),
        out_dir=checkpoints[pos],
    )
    argv = [f"--out_dir={checkpoints[pos]}", "--max_new_tokens=4", *(flag.format(**files) for flag in flags)]
    err = error_line(capsys, sample, argv, 2)
    assert f"error: {words.format(**files)}" in err, err


@pytest.mark.parametrize(
    "flags, words",
    [
        (
            ["--rope_scaling=yarn"],
            "--rope_scaling=yarn extends RoPE; no compared checkpoint takes it: "
            "{learned} (pos=learned), {fire} (pos=fire)",
        ),
        (
            ["--rope_scaling=yarn", "--rope_factor=3"],
            "--rope_scaling=yarn --rope_factor=3 extends RoPE; no compared checkpoint takes it",
        ),
        (["--init_from=gpt2"], "--init_from names the one model to sample, --compare several"),
    ],
    ids=["scaling", "factor", "init_from"],
)
def test_compare_refuses_a_flag_that_no_compared_checkpoint_takes(
    checkpoints, capsys, monkeypatch, flags, words
):
    """--compare with a RoPE extension flag where none of the checkpoints is RoPE, or with --init_from (which
    names the one model to sample): one line, status 2, before any sample, not silently ignored."""
    monkeypatch.setattr(sample, "print_samples", lambda *a, **k: pytest.fail("a model was sampled"))
    argv = ["--compare", checkpoints["learned"], checkpoints["fire"], "--max_new_tokens=4", *flags]
    err = error_line(capsys, sample, argv, 2)
    assert words.format(**checkpoints) in err, err


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_dtype_bfloat16_decodes_in_bfloat16_with_float32_position_tables(checkpoints, capsys, pos):
    """--dtype=bfloat16 (auto's choice on CUDA) casts the weights, and so the KV caches, to bfloat16; the
    position tables (buffers) stay float32; every scheme generates its tokens past the trained length, the
    cached sampler and the reference alike. --dtype=auto on a CPU is float32."""
    flags = [f"--out_dir={checkpoints[pos]}", "--max_new_tokens=40", "--stream=off", "--dtype=bfloat16"]
    for cache in ("on", "off"):
        (loaded, samples, _), _ = run_sample(capsys, *flags, f"--kv_cache={cache}")
        model = loaded.model
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        assert {b.dtype for b in model.transformer.wpe.buffers() if b.is_floating_point()} <= {torch.float32}
        assert len(samples[0]) == 1 + 40
        if cache == "on":
            assert model.transformer.h[0].attn.kv_cache.k.dtype == torch.bfloat16
    (loaded, _, _), _ = run_sample(capsys, f"--out_dir={checkpoints[pos]}", "--max_new_tokens=4")
    assert loaded.model.lm_head.weight.dtype == torch.float32
