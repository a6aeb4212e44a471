"""
Generate text from a trained checkpoint, by default 4x past the length it was trained on, and see what
each position scheme does there.

    python sample.py --out_dir=out/shakespeare_char_rope
    python sample.py --out_dir=out/shakespeare_char_learned --start="ROMEO:" --num_samples=2
    python sample.py --out_dir=out/shakespeare_char_rope --max_new_tokens=1024 --rope_scaling=yarn
    python sample.py --out_dir=out/shakespeare_char_rope --rope_scaling=llama3 --rope_factor=8
    python sample.py --compare out/shakespeare_char_learned out/shakespeare_char_rope --seed=1

The checkpoint carries the model config and the vocabulary: --out_dir is all it needs. The text marks where
the trained length was crossed. --compare runs the same prompt, seed and settings through several checkpoints
and reports each one's speed (their losses past the trained length: python -m lab.eval_length). A model or a
generation that does not fit in memory is one line naming what to lower (status 1). Ctrl-C stops quietly
(status 130).
"""

from plumbing.errors import quiet_ctrl_c

if __name__ == "__main__":  # a Ctrl-C while the imports below load torch (seconds): status 130, no traceback
    quiet_ctrl_c()

import time
from collections import namedtuple
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace

import torch

from generation import captured_on, decode_mode, generate_cached
from model import GPTConfig, NonFiniteLogits
from plumbing import hardware
from plumbing.checkpoint import (
    check_settings,
    checkpoint_path,
    open_checkpoint,
    open_model,
    pretrained_checkpoint,
    rope_overrides,
)
from plumbing.cli import (
    check_original_len,
    device_flag,
    machine_device,
    parse_flags,
    read_prompt,
    section_names,
    threads_flag,
)
from plumbing.errors import UserError, one_line_errors
from plumbing.fields import changed_fields, check_fields, require, setting
from plumbing.gpt2 import GPT2_MODELS
from plumbing.report import describe_model
from plumbing.tokenizers import get_tokenizer
from positions import POSITION_MODULES, default_rope_factor, takes


@dataclass
class SampleConfig:
    out_dir: str = setting("out/shakespeare_char_rope", path=True)  # where train.py wrote best.pt / ckpt.pt
    init_from: str | None = setting(None, choices=GPT2_MODELS)  # instead of out_dir, OpenAI's GPT-2 weights
    compare: list[str] | None = setting(None, path=True)  # several out_dirs side by side (overrides out_dir)
    start: str = "\n"  # the prompt, or FILE:path to read it from a file
    num_samples: int = setting(1, at_least=1)  # independent samples, generated as one batch
    max_new_tokens: int | None = setting(None, at_least=1)  # default: 4 x the trained block_size, past it
    temperature: float = setting(0.8, at_least=0)  # < 1 sharpens, > 1 flattens; 0: the most likely token
    top_k: int | None = setting(200, at_least=0)  # only among the k most likely tokens (0 or None: all)
    top_p: float | None = setting(None, above=0, at_most=1)  # nucleus: the fewest tokens of probability top_p
    seed: int = setting(1337, at_least=0)  # same seed, same settings: same text
    device: str = device_flag()  # auto | cpu | cuda | cuda:N | mps
    threads: str = threads_flag()
    kv_cache: bool = True  # False: the reference sampler that recomputes the whole context per token
    compile: bool = False  # compile the cached decode step once (static shapes; CUDA graphs on CUDA)
    cuda_graph: bool = True  # on CUDA, a token one replay of the decode step's CUDA graph; off: eager
    max_context: int | None = setting(None, at_least=1)  # attend to at most this many latest tokens
    stream: bool = True  # print tokens as they are produced (one sample, with the KV cache)
    dtype: str = setting("auto", choices=hardware.DTYPES)  # weights and KV caches; auto: bfloat16 on CUDA
    # no flag: the scheme settings given (at_sampling_flags), applied over the checkpoint's, checked by their
    # Settings here; --rope_scaling without --rope_factor: s = the generated length over block_size
    pos_settings: dict = field(default_factory=dict)

    def __post_init__(self):
        check_fields(self)
        if self.top_k == 0:
            self.top_k = None
        both = "--init_from names the one model to sample, --compare several: name GPT-2 among --compare's"
        require(self.compare is None or self.init_from is None, f"{both} (--compare gpt2 out/...)")
        check_settings(**self.pos_settings)  # by their schemes' rules: a factors file read and checked
        cache = "--compile compiles the KV-cached decode step: drop --kv_cache=off"
        require(self.kv_cache or not self.compile, cache)


def at_sampling_flags():
    """parse_flags' sections of the scheme settings a sampling run may change: each Settings' at_sampling."""
    return [(f"pos={name}'s settings, over the checkpoint's", scheme.Settings, scheme.Settings.at_sampling)
            for name, scheme in POSITION_MODULES.items()
            if getattr(scheme.Settings, "at_sampling", ())]  # fmt: skip


def parse_args(argv=None):
    """Flags (and --config) -> SampleConfig; a bad flag or value is one line and status 2, as in train.py."""
    own = [f.name for f in fields(SampleConfig) if f.name != "pos_settings"]
    schemes, given = at_sampling_flags(), set()
    values = parse_flags(argv, "sample.py", __doc__, [("sampling", SampleConfig, own), *schemes], given=given)
    settings = {name: values.pop(name) for name in section_names(schemes)}
    return SampleConfig(**values, pos_settings={name: v for name, v in settings.items() if name in given})


# what sizes a generation's memory: its KV cache, the tokens, each forward's logits and mask
GENERATING = "lower --max_new_tokens or --num_samples, or bound the context with --max_context"
MARKER = "[[trained length {} ends here]]"  # where the text crosses the trained length
# the GPT in eval mode, its tokenizer, and the checkpoint's configs, meta and progress (not its tensors)
Loaded = namedtuple("Loaded", "model tokenizer checkpoint")


def load(out_dir, device, rope_scaling=None, rope_factor=1.0, checkpoint=None, llama3_factors=(None, None),
         longrope=None):  # fmt: skip
    """The model in out_dir, eval mode, through the one opener (plumbing.checkpoint.open_model, whose
    arguments these are); the checkpoint's weights and optimizer state are not kept beside the model's."""
    model, tokenizer, checkpoint = open_model(
        out_dir, device, checkpoint, rope_scaling, rope_factor, llama3_factors, longrope
    )
    return Loaded(model, tokenizer, {k: v for k, v in checkpoint.items() if k not in ("model", "optimizer")})


def mark_trained_length(tokenizer, ids, block_size):
    """The decoded text with a marker at the token where the trained length ends."""
    if len(ids) <= block_size:
        return tokenizer.decode(ids)
    before, after = tokenizer.decode(ids[:block_size]), tokenizer.decode(ids[block_size:])
    return before + MARKER.format(block_size) + after


class Streamer:
    """Prints sample 0 as it is generated, as mark_trained_length would. Its tokens stay on the device until
    chunk_tokens of them are waiting or chunk_seconds have passed since the last print (a slow model: each
    token as it comes), then are read in one transfer: a read per token would make every token wait for the
    GPU. Each print decodes only the ids not printed yet; an id ending inside a multi-byte character is held
    back until the character is whole (or close)."""

    chunk_tokens, chunk_seconds = 32, 0.05

    def __init__(self, tokenizer, prompt_ids, block_size, clock=time.perf_counter):
        self.tokenizer, self.block_size, self.clock = tokenizer, block_size, clock
        self.n_ids = len(prompt_ids)  # ids printed or waiting: the prompt's, then each new token
        self.waiting = []  # (1, 1) tokens on the device, not read yet
        self.pending = []  # ids read but not printed yet
        print(mark_trained_length(tokenizer, prompt_ids, block_size), end="", flush=True)
        self.printed_at = clock()

    def __call__(self, next_ids):
        self.waiting.append(next_ids[:1])
        if len(self.waiting) >= self.chunk_tokens or self.clock() - self.printed_at >= self.chunk_seconds:
            self.flush()

    def flush(self):
        ids = torch.cat(self.waiting, dim=1)[0].tolist() if self.waiting else []  # one read for them all
        self.waiting = []
        for i in ids:
            if self.n_ids == self.block_size:  # this token is the first past the trained length
                self._print(self.tokenizer.decode(self.pending) + MARKER.format(self.block_size))
            self.pending.append(i)
            self.n_ids += 1
        text = self.tokenizer.decode(self.pending)
        if not text.endswith("\ufffd"):
            self._print(text)
        self.printed_at = self.clock()

    def close(self):
        self.flush()
        if self.pending:
            self._print(self.tokenizer.decode(self.pending))

    def _print(self, text):
        print(text, end="", flush=True)
        self.pending = []


def load_for_generation(out_dir, cfg, device, compared=False):
    """The model of out_dir (or a GPT2_MODELS name) with cfg.pos_settings applied, and its prompt's ids:
    -> (Loaded, cfg, prompt ids, max_new_tokens). The checkpoint is mapped, not read, and let go on return:
    the weights live once, in the model; one that does not fit in memory is one line (status 1).
    compared: one of --compare's, where a scheme's settings apply to its own checkpoints only (--rope_*)."""
    path = None if out_dir in GPT2_MODELS else checkpoint_path(out_dir)
    flag = "--compare" if compared else "--init_from"
    checkpoint = open_checkpoint(path, mmap=True) if path else pretrained_checkpoint(out_dir, flag)
    saved = checkpoint["model_config"]  # open_checkpoint brought an older one up to date
    block_size, settings = saved["block_size"], saved["pos_settings"]
    if compared:  # the settings of the scheme of this checkpoint
        own = {f.name for f in fields(POSITION_MODULES[saved["pos"]].Settings)}
        cfg = replace(cfg, pos_settings={n: v for n, v in cfg.pos_settings.items() if n in own})
    try:
        prompt_ids = get_tokenizer(checkpoint["meta"]).encode(cfg.start)
    except UserError as e:  # say the prompt was the default one, not the user's
        default = f"the default prompt, a newline, is not in {out_dir}'s vocabulary ({e}): give --start"
        raise (e if cfg.start != SampleConfig.start else UserError(default)) from None
    if not prompt_ids:
        raise UserError("the prompt is empty: give --start some text")
    max_new_tokens = cfg.max_new_tokens or 4 * block_size
    given = {}
    for checked in check_settings(**cfg.pos_settings).values():  # a factors file read into its values
        given |= {name: getattr(checked, name) for name in cfg.pos_settings} | changed_fields(checked)
    if given.get("rope_scaling") and "rope_factor" not in given:
        given["rope_factor"] = default_rope_factor(len(prompt_ids) + max_new_tokens, block_size)
    if "rope_factors" in cfg.pos_settings:  # LongRoPE's, searched for the checkpoint's original length
        original = settings.get("rope_original_len") or block_size
        check_original_len(given.get("rope_original_len"), original, f"{out_dir}'s original length")
    try:  # a setting the model refuses is the --rope_* flags' mistake, not the checkpoint's
        scaling = rope_overrides(given.pop("rope_scaling", None), given.pop("rope_factor", None)) | given
        GPTConfig.from_flat(**GPTConfig(**saved).flat() | scaling)  # the model open_model will build
    except ValueError as e:
        raise UserError(f"{rope_flags(cfg)} on {out_dir}: {e}", 2) from None
    shape = ", ".join(f"{name}={saved[name]:,}" for name in ("block_size", "n_layer", "n_embd"))
    with hardware.out_of_memory(
        f"the model of {path or out_dir} ({shape}) does not fit: use another checkpoint"
    ):
        loaded = load(out_dir, device, checkpoint=checkpoint, longrope=scaling)
    loaded.model.cast_weights(hardware.resolve_dtype(cfg.dtype, torch.device(device).type))
    return loaded, cfg, prompt_ids, max_new_tokens


def rope_flags(cfg):
    """The scheme settings' flags given (--rope_*), as typed: '--rope_scaling=yarn --rope_factor=2'."""
    shown = lambda value: f"{value:g}" if isinstance(value, float) else value
    return " ".join(f"--{name}={shown(value)}" for name, value in cfg.pos_settings.items())


@contextmanager
def blamed_on(out_dir):
    """Logits that are not finite (model.NonFiniteLogits: the weights overflow) named by the model's file."""
    try:
        yield
    except NonFiniteLogits as e:
        path = out_dir if out_dir in GPT2_MODELS else checkpoint_path(out_dir)
        raise UserError(f"{path}: {e}") from None


def print_samples(loaded, cfg, prompt_ids, max_new_tokens, device, stream, threads=None):
    """Generate (seeded with cfg.seed) and print cfg.num_samples continuations of prompt_ids, streaming one
    sample as it is produced (threads: a line to print under the model's). -> (samples, tokens/s)"""
    model, total_len = loaded.model, len(prompt_ids) + max_new_tokens
    print(describe_model(model) + (f"\n{threads}" if threads else ""))
    if (limit := model.length_limit) is not None and total_len > limit:
        print(f"note: pos={model.config.pos} has no positions past {limit}: from there on the model sees "
              f"only the last {limit} tokens (the context is cropped)")  # fmt: skip
    varies = model.transformer.wpe.step_varies
    if varies and cfg.kv_cache and cfg.cuda_graph and not cfg.compile and captured_on(device):
        print(f"note: {varies}: decoding eagerly, without a CUDA graph")
    stream = stream and cfg.kv_cache and cfg.num_samples == 1
    torch.manual_seed(cfg.seed)
    idx = torch.tensor([prompt_ids] * cfg.num_samples, dtype=torch.long, device=device)
    sampling = {name: getattr(cfg, name) for name in ("temperature", "top_k", "top_p", "max_context")}
    start, timing = time.perf_counter(), {}
    if not cfg.kv_cache:
        out = model.generate(idx, max_new_tokens, **sampling)
    else:
        on_token = Streamer(loaded.tokenizer, prompt_ids, model.config.block_size) if stream else None
        how = dict(on_token=on_token, compile=cfg.compile, cuda_graph=None if cfg.cuda_graph else False)
        out = generate_cached(model, idx, max_new_tokens, **how, **sampling, timing=timing)  # graph: on CUDA
        if on_token:
            on_token.close()
    hardware.synchronize(device)
    seconds = time.perf_counter() - start
    samples = out.tolist()
    for ids in samples:
        if not stream:
            print(mark_trained_length(loaded.tokenizer, ids, model.config.block_size), end="")
        print("\n" + "-" * 60)
    how, setup = decoding(model, cfg, device)
    if timing.get("decode_tokens"):  # the decode loop's rate, its one-off setup beside it
        tokens_per_second = cfg.num_samples * timing["decode_tokens"] / timing["decode_seconds"]
        how += f"), after {timing['setup_seconds']:.2f} s of setup ({setup}"
    else:  # no loop to time apart (the reference sampler, or 2 tokens at most): every token
        tokens_per_second = cfg.num_samples * max_new_tokens / seconds
    print(f"{tokens_per_second:.1f} tokens/s ({how})")
    return samples, tokens_per_second


def decoding(model, cfg, device):
    """How the tokens were decoded (generation.decode_mode's choice), and what the one-off setup before the
    decode loop held, for the tokens/s line. -> (how, setup)"""
    if not cfg.kv_cache:
        return "no cache", None
    mode = decode_mode(model, device, cfg.compile, None if cfg.cuda_graph else False)
    step = "its capture" if model.lm_head.weight.is_cuda else "the first step"
    how = dict(eager="KV cache", cuda_graph="KV cache, one CUDA graph replay a token")
    setup = dict(eager="prefill, the first step", cuda_graph=f"prefill, warm-up, {step}")
    return how.get(mode, "compiled KV cache"), setup.get(mode, f"prefill, compilation, {step}")


def compare(cfg, device, threads):
    """Every checkpoint in cfg.compare with the same prompt, seed and settings (--rope_scaling applied to the
    RoPE ones only), then a summary table; threads: a line to print once every checkpoint is checked. Each
    is opened and checked (its weights, its vocabulary against the prompt) before any sample, then let go:
    one model in memory at a time. Their losses past T: python -m lab.eval_length."""
    schemes = {out_dir: load_for_generation(out_dir, cfg, device, True)[0].model.config.pos
               for out_dir in cfg.compare}  # fmt: skip
    rope = any(takes(POSITION_MODULES[pos], "rope_scaling") for pos in schemes.values())
    if (flags := rope_flags(cfg)) and not rope:
        compared = ", ".join(f"{out_dir} (pos={pos})" for out_dir, pos in schemes.items())
        raise UserError(f"{flags} extends RoPE; no compared checkpoint takes it: {compared}", 2)
    print(threads)
    rows = []
    for out_dir in cfg.compare:
        print(f"\n=== {out_dir} ===")
        loaded, cfg_here, prompt_ids, max_new_tokens = load_for_generation(out_dir, cfg, device, True)
        with blamed_on(out_dir), hardware.out_of_memory(GENERATING):
            _, tokens_per_second = print_samples(loaded, cfg_here, prompt_ids, max_new_tokens, device, False)
        rows.append((out_dir, loaded.model.config, tokens_per_second))  # one model at a time
    print(f"\n{'checkpoint':<34} {'pos':<11} {'T':>5} {'scaling':<10} {'tokens/s':>9}")
    for out_dir, c, speed in rows:
        scaling = getattr(c.pos_settings, "rope_scaling", None)
        print(f"{out_dir:<34} {c.pos:<11} {c.block_size:>5} {scaling or '-':<10} {speed:>9.1f}")
    return rows


def main(argv=None):
    """-> (Loaded, samples, tokens/s); with --compare a row per checkpoint: (out_dir, GPTConfig, tokens/s)."""
    with one_line_errors("sample.py"):  # Ctrl-C too: quietly, with the status a shell gives it (130)
        cfg = parse_args(argv)
        device = machine_device(cfg.device)
        threads = hardware.use_threads(cfg.threads, device)  # printed under the model's line
        cfg = replace(cfg, start=read_prompt(cfg.start))  # once, before any checkpoint is loaded
        if cfg.compare is not None:
            return compare(cfg, device, threads)
        out_dir = cfg.init_from or cfg.out_dir
        loaded, cfg, prompt_ids, max_new_tokens = load_for_generation(out_dir, cfg, device)
        with blamed_on(out_dir), hardware.out_of_memory(GENERATING):
            return loaded, *print_samples(
                loaded, cfg, prompt_ids, max_new_tokens, device, cfg.stream, threads
            )


if __name__ == "__main__":
    main()
