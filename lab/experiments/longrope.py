"""LongRoPE's search (Ding et al. 2024, section 3.2, Algorithm 1): a rescale factor lambda_i per RoPE
frequency pair (theta_i / lambda_i) and n-hat, the first positions left at plain RoPE, found by evolution for
a trained checkpoint at s times its original length, where PI, NTK, YaRN and llama3 each give a formula.

    python -m lab.experiments.longrope out/shakespeare_char_rope --factor 4            # ~4 min on 2 CPU cores
    python train.py --init_from=out/shakespeare_char_rope --block_size=256 \\
        --rope_factors=out/shakespeare_char_rope_longrope_x4/factors.json          # fine-tune with them
    python -m lab.experiments.longrope out/shakespeare_char_rope_ctx256_longrope --factor 8  # progressive
    python -m lab.experiments.longrope out/shakespeare_char_rope_ctx256_longrope --short  # short ones, at T

Fitness: loss, the mean loss of windows of L = s x T tokens from the TRAIN split (every evaluation reads val),
or passkey (as LongRoPE2's needle-driven search), the loss on the key's digits over passkey samples of L
tokens. Factors lie in [1, 1 + L/T] and rise from the fastest pair, as microsoft/LongRoPE's released search
draws them (evolution/algorithms/dim_mono.py; --top bounds them otherwise); the first population is PI's,
NTK's and YaRN's factors (and the checkpoint's own), each generation keeps the best --parents and breeds
mutations and crossovers; the same seed gives the same search (docs/extrapolation.md, LongRoPE). Writes
factors.json (--rope_factors for train.py, sample.py and lab/eval_length.py), fitness.csv and factors.png
under --out ({checkpoint folder}_longrope_x{s}, or _short)."""

import sys

if not __package__:  # `python lab/experiments/longrope.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.experiments.longrope`")


import importlib.util
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data.common import check_split, ensure_prepared, load_meta
from data.passkey.task import CHARS, KEY_DIGITS
from lab.experiments.runs import study_inputs
from lab.measure.instruments import pyplot, save_figure
from lab.measure.losses import token_losses, window_losses, window_starts
from lab.measure.retrieval import passkey_batch
from lab.outputs import check_outputs, write_output, write_rows
from model import GPTConfig
from plumbing.checkpoint import checkpoint_path, open_checkpoint, open_model, run_folder
from plumbing.cli import device_flag, machine_device, parse_flags
from plumbing.errors import UserError, one_line_errors
from plumbing.fields import check_fields, setting
from positions import LONGROPE, POSITION_MODULES, require, rope_frequencies, rope_inv_freq, rotary_dim, takes

PROG = "python -m lab.experiments.longrope"
N_HATS = (0, 1, 2, 4, 8, 16, 32, 64, 128)  # n-hat's choices (the paper's set starts 0, 1, 2, 4, 8, 12, 16...)
SIGMA = 0.25  # a mutation's step in ln(lambda): about x1.28 or /1.28
FITNESSES = ("loss", "passkey")
PASSKEY_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # where the key is stated (lab/eval_length.py's --depths)


def longrope_baselines(head_dim, base, factor, original_len):
    """The per-pair factors lambda_i = theta_i / theta'_i of the formula scalings at s = factor, LongRoPE's
    search's starting points and its figure's references: {"linear": s for every pair, "ntk", "yarn",
    "llama3": from their frequencies}. -> {name: (d/2,) float64}"""
    theta = rope_inv_freq(head_dim, base)
    scaled = {name: rope_frequencies(head_dim, base, name, factor, original_len)[0].double()
              for name in ("linear", "ntk", "yarn", "llama3")}  # fmt: skip
    return {name: (theta / value).clamp(min=1.0) for name, value in scaled.items()}


@dataclass
class SearchConfig:
    checkpoint: str  # a RoPE run's folder or checkpoint file
    factor: float = 4.0  # s: the search's length is s x the original length T (long factors)
    short: bool = False  # search the short factors at L = T instead (the paper's short-context recovery)
    population: int = setting(16, at_least=1)  # candidates per generation (the paper: 64)
    generations: int = setting(12, at_least=1)  # (the paper: 40)
    parents: int = setting(4, at_least=1)  # the best kept each generation, which breed the rest
    mutation: float = 0.3  # probability that a mutation changes each factor, and n-hat (the paper: 0.3)
    windows: int = setting(
        8, at_least=1
    )  # loss: train-split windows of L tokens a fitness; passkey: samples a depth
    fitness: str = "loss"  # loss: the train split's loss; passkey: the loss on the key's digits at the answer
    n_hat: int | None = None  # the first positions kept at plain RoPE, fixed; None: searched over N_HATS
    top: float | None = None  # the factors' bound, a multiple of L/T (2: 2 L/T); None: 1 + L/T, as released
    passkey_seed: int = 1  # --fitness=passkey's samples (lab/eval_length.py evaluates its --passkey_seed, 0)
    seed: int = 0
    out: str | None = None  # output folder; None: beside the checkpoint's folder
    device: str = device_flag("cpu")

    def __post_init__(self):
        require(self.factor > 1 or self.short, f"factor must be > 1 (the extension), got {self.factor}")
        check_fields(self)
        p, n = self.parents, self.population
        require(p < n, f"parents={p} must be < population={n}")
        require(0 <= self.mutation <= 1, f"mutation must be in [0, 1], got {self.mutation}")
        require(self.fitness in FITNESSES, f"fitness={self.fitness!r}: choose {' or '.join(FITNESSES)}")
        n_hat = self.n_hat is None or self.n_hat >= 0
        require(n_hat, f"n_hat must be >= 0 (e.g. {', '.join(map(str, N_HATS[:5]))}), or unset to search it")
        top = self.top is None or self.top >= 1
        require(top, f"top must be >= 1 (x L/T: PI's factor), or unset for 1 + L/T, got {self.top}")
        why = "0 draws lab/eval_length.py's evaluation samples"
        require(self.passkey_seed >= 1, f"passkey_seed must be >= 1 ({why}), got {self.passkey_seed}")


def constrain(factors, top):
    """The nearest valid factors: each in [1, top], then a running maximum from the fastest pair."""
    return tuple(np.maximum.accumulate(np.clip(np.asarray(factors, dtype=np.float64), 1.0, top)).tolist())


def mutate(candidate, rng, probability, top, n_hats=N_HATS):
    factors, n_hat = candidate
    changed = rng.random(len(factors)) < probability
    factors = np.where(changed, np.asarray(factors) * np.exp(rng.normal(0.0, SIGMA, len(factors))), factors)
    if rng.random() < probability:  # n-hat to a neighbouring choice
        i = n_hats.index(n_hat) + rng.choice((-1, 1))
        n_hat = n_hats[min(max(i, 0), len(n_hats) - 1)]
    return constrain(factors, top), n_hat


def crossover(a, b, rng, top):
    factors = np.where(rng.random(len(a[0])) < 0.5, a[0], b[0])
    return constrain(factors, top), a[1] if rng.random() < 0.5 else b[1]


def evolve(fitness, seeds, cfg, top, rng, log=print, n_hats=N_HATS):
    """Algorithm 1, elitist (the best never gets worse): the best cfg.parents breed half mutations, half
    crossovers. fitness(candidate) -> loss (lower is better), once per candidate; n-hat one of n_hats (the
    seeds' included). -> (best, history)"""
    seeds = list(dict.fromkeys(seeds))  # each once
    population = list(seeds)
    while len(population) < cfg.population:
        population.append(mutate(seeds[rng.integers(len(seeds))], rng, cfg.mutation, top, n_hats))
    scores, history = {}, []
    for generation in range(cfg.generations):
        started = time.perf_counter()
        for candidate in population:
            if candidate not in scores:
                scores[candidate] = fitness(candidate)
        ranked = sorted(population, key=scores.get)
        losses = [scores[c] for c in population]
        best, mean = scores[ranked[0]], float(np.mean(losses))
        row = dict(generation=generation, best=best, mean=mean, worst=max(losses), n_hat=ranked[0][1])
        history.append(row)
        log(
            f"generation {generation + 1}/{cfg.generations}: best loss {best:.4f} (n-hat {ranked[0][1]}), "
            f"mean {mean:.4f}, {time.perf_counter() - started:.0f} s"
        )
        parents, children = ranked[: cfg.parents], []
        while len(parents) + len(children) < cfg.population:
            a, b = (parents[i] for i in rng.choice(len(parents), 2, replace=len(parents) < 2))
            child = (
                mutate(a, rng, cfg.mutation, top, n_hats) if len(children) % 2 else crossover(a, b, rng, top)
            )
            children.append(child)
        population = parents + children
    return min(scores, key=scores.get), history


def bound(cfg, length, T):
    """The largest factor: 1 + L/T, the released search's (module docstring), or --top x L/T."""
    return 1 + length / T if cfg.top is None else cfg.top * length / T


def search_tokens(dataset):
    """data/<dataset>/train.bin as a read-only np.memmap: the loss fitness's windows, apart from every
    evaluation window (lab/eval_length.py and the study read val.bin through
    lab.measure.losses.validation_tokens)."""
    data_dir = ensure_prepared(dataset)
    meta = load_meta(data_dir)
    check_split(data_dir, "train", meta)
    return np.memmap(data_dir / "train.bin", dtype=meta["dtype"], mode="r")


def passkey_vocabulary(ckpt, path):
    """{char: id} of a checkpoint trained on the passkey vocabulary; a one-line error for any other."""
    chars = ckpt.get("meta", {}).get("chars") or []
    require(
        set(CHARS) <= set(chars),
        f"{path}: --fitness=passkey needs a checkpoint trained on the passkey vocabulary "
        "(python train.py --config configs/passkey.toml); use --fitness=loss",
    )
    return {c: i for i, c in enumerate(chars)}


def passkey_fitness(model, samples, device):
    """The cross-entropy of the keys' KEY_DIGITS digits at the answer, each given the true text before it,
    averaged over samples [(tokens, answer_start) of lab.measure.retrieval.passkey_batch]."""
    losses = []
    for tokens, answer_start in samples:
        tokens = tokens.to(device)
        token_loss = token_losses(model, tokens[:, :-1], tokens[:, 1:])
        losses.append(token_loss[:, answer_start - 1 : answer_start - 1 + KEY_DIGITS].mean().item())
    return float(np.mean(losses))


def settings(config, candidate, short, s):
    """The checkpoint's model with candidate's factors as its long (or short) ones: open_model's longrope."""
    kept, searched = ("rope_long_factor", "rope_short_factor")[:: 1 if short else -1]
    other = config[kept] if config.get("rope_scaling") == LONGROPE else [1.0] * len(candidate[0])
    chosen = {"rope_scaling": LONGROPE, "rope_factor": s, kept: list(other), searched: list(candidate[0])}
    return chosen | {"rope_keep_first": candidate[1]}


def plot_factors(path, best, base, T, s, short):
    """The searched factors per pair against the formulas' (longrope_baselines), log scale."""
    fig, ax = pyplot().subplots(figsize=(7, 4))
    for name, value in longrope_baselines(2 * len(best[0]), base, s, T).items():
        ax.plot(value.numpy(), label=name, linestyle="--")
    ax.plot(best[0], label=f"LongRoPE, searched (n-hat {best[1]})", color="black", linewidth=2, marker="o")
    ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(lambda value, _: f"{value:g}")
    title = f"{'short' if short else 'long'} factors at s = {s:g}, T = {T}"
    ax.set(xlabel="pair i (fast -> slow)", ylabel="lambda_i = theta_i / theta'_i", title=title)
    ax.legend()
    save_figure(fig, path)


def write_outputs(out, best, history, config, T, s, short):
    chosen = settings(config, best, short, s)
    factors = {"type": "longrope"} | {f"{k}_factor": chosen[f"rope_{k}_factor"] for k in ("short", "long")}
    factors |= dict(original_max_position_embeddings=T, factor=s, keep_first=best[1])
    lines = ",\n".join(f"  {json.dumps(key)}: {json.dumps(value)}" for key, value in factors.items())
    write_rows("out", out / "fitness.csv", list(history[0]), [list(row.values()) for row in history])
    if importlib.util.find_spec("matplotlib") is None:
        print("note: matplotlib is not installed: no factors.png (pip install matplotlib)")
    else:
        plot_factors(out / "factors.png", best, config["rope_base"], T, s, short)
    # last, whole or not at all: a folder with factors.json is a finished search
    # (lab.experiments.extrapolation)
    write_output("out", out / "factors.json", lambda tmp: tmp.write_text(f"{{\n{lines}\n}}\n"))


def main(argv=None):
    with one_line_errors(PROG):
        sections = [("search", SearchConfig, None)]
        cfg = SearchConfig(**parse_flags(argv, PROG, __doc__, sections, positional=("checkpoint",)))
        device = machine_device(cfg.device)
        path = checkpoint_path(cfg.checkpoint)
        ckpt = open_checkpoint(path, mmap=True)
        config = GPTConfig(**ckpt["model_config"]).flat()  # its fields and settings, by name
        require(
            takes(POSITION_MODULES[config["pos"]], "rope_scaling"),
            f"{path}: pos={config['pos']}: LongRoPE rescales RoPE's frequencies",
        )
        T = config.get("rope_original_len") or config["block_size"]
        rotary = rotary_dim(config["n_embd"] // config["n_head"], config.get("rope_fraction", 1.0))
        s = config["rope_factor"] if cfg.short else cfg.factor
        require(
            not cfg.short or (config.get("rope_scaling") and s > 1),
            f"{path}: --short searches the short factors of a run extended by its rope_factor s > 1 (a "
            f"LongRoPE fine-tune); it has s = {s:g} (rope_scaling {config.get('rope_scaling')}): search long "
            "factors with --factor instead",
        )
        length = T if cfg.short else round(cfg.factor * T)
        require(
            cfg.n_hat is None or cfg.n_hat < length,
            f"--n_hat={cfg.n_hat}: the first n_hat positions keep plain RoPE, the factors apply only below "
            f"the length searched, L = {length}: give an n_hat from 0 to {length - 1}, or leave it out",
        )
        top, n_hats = bound(cfg, length, T), N_HATS if cfg.n_hat is None else (cfg.n_hat,)
        if cfg.short:
            seeds = [(tuple([1.0] * (rotary // 2)), n_hats[0])]
        else:
            baselines = longrope_baselines(rotary, config["rope_base"], s, T).values()
            seeds = [(constrain(f.tolist(), top), n_hats[0]) for f in baselines]
        if config.get("rope_scaling") == LONGROPE:  # progressive: the checkpoint's own factors, scaled to s
            own = config["rope_short_factor"] if cfg.short else config["rope_long_factor"]
            scale = 1.0 if cfg.short else s / config["rope_factor"]
            n_hat = min(n_hats, key=lambda n: abs(n - config["rope_keep_first"]))
            seeds.insert(0, (constrain(np.asarray(own) * scale, top), n_hat))
        out = Path(cfg.out or f"{run_folder(cfg.checkpoint)}_longrope_{'short' if cfg.short else f'x{s:g}'}")
        if (out / "factors.json").exists():
            raise UserError(f"{out}/factors.json exists: give another --out, or move it away", 2)
        if cfg.fitness == "passkey":
            stoi = passkey_vocabulary(ckpt, path)
            samples = [passkey_batch(stoi, length, d, cfg.windows, cfg.passkey_seed) for d in PASSKEY_DEPTHS]
        else:
            dataset = (ckpt.get("train_config") or {}).get("dataset")
            require(dataset, f"{path}: no train_config.dataset: the search measures loss on its train split")
            tokens = search_tokens(dataset)
            starts = window_starts(len(tokens), length, cfg.windows, split="train")
        read = study_inputs(path)  # the checkpoint, and the folder of the dataset it searches on: data/
        for written in ("factors.json", "fitness.csv"):  # before the search; its folder made last
            check_outputs({"out": out / written}, read)

        @torch.no_grad()
        def fitness(candidate):
            model = open_model(path, device, ckpt, longrope=settings(config, candidate, cfg.short, s))[0]
            if cfg.fitness == "passkey":
                return passkey_fitness(model, samples, device)
            return window_losses(model, tokens, length, starts, len(starts), device).mean().item()

        print(
            f"searching {'short' if cfg.short else 'long'} factors for {path} at L = {length} tokens "
            f"(T = {T}, s = {s:g}, factors <= {top:g}, fitness {cfg.fitness}): "
            f"{cfg.population} candidates x {cfg.generations} generations"
        )
        started = time.perf_counter()
        rng = np.random.default_rng(cfg.seed)
        best, history = evolve(fitness, seeds, cfg, top, rng, n_hats=n_hats)
        write_outputs(out, best, history, config, T, s, cfg.short)
        print(
            f"best loss {history[-1]['best']:.4f} (initial population's best {history[0]['best']:.4f}), "
            f"n-hat {best[1]}, in {time.perf_counter() - started:.0f} s: {out}/factors.json, fitness.csv, "
            "factors.png"
        )


if __name__ == "__main__":
    main()
