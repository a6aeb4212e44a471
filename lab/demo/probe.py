"""Where does position live? Linear probes read each token's position from the hidden states of a trained
model of each scheme, layer by layer.

    python -m lab.demo.probe                          # the README's runs, out/shakespeare_char_<pos>
    python -m lab.demo.probe --checkpoints=DIR        # or the runs in DIR/<pos> or DIR/shakespeare_char_<pos>
    python -m lab.demo.probe --figure=docs/figures/probe.png

Targets: each token's position in the window, and its distance back to the latest newline. Least squares with
a small ridge, fit on half the validation windows and scored (R^2) on the other half, after the embedding and
every block; beside each, the same probe on shuffled targets. NoPE is probed again without its causal mask:
attention then sees a set, and position has no way in (lesson section 1)."""

import sys

if not __package__:  # `python lab/demo/probe.py`: the repository's packages are not importable
    sys.exit(f"{sys.argv[0]}: error: run it from the repository root as `python -m lab.demo.probe`")


from dataclasses import dataclass

from lab.experiments.runs import inputs_of, model_dirs
from lab.measure import instruments
from plumbing.cli import parse_flags
from plumbing.errors import UserError, one_line_errors
from positions import POS_SCHEMES, overrides

PROG = "python -m lab.demo.probe"
TARGETS = {"position": "absolute position", "newline": "distance to the latest newline"}
NOPE_UNMASKED = "none, no mask"


@dataclass
class ProbeConfig:
    checkpoints: str | None = None  # a folder holding <pos>/ or shakespeare_char_<pos>/; default: README's
    windows: int = 512  # validation windows of block_size tokens; the first half fits, the second half scores
    ridge: float = 1e-3  # ridge penalty, relative to the mean diagonal of X^T X
    figure: str | None = None  # also draw the R^2 per layer as a PNG at this path (needs matplotlib)
    replace: bool = False  # --figure may replace a file this command did not write

    def __post_init__(self):
        if self.windows < 4:
            raise ValueError(f"windows must be >= 4 (half fit the probe, half score it), got {self.windows}")
        if self.ridge < 0:
            raise ValueError(f"ridge must be >= 0, got {self.ridge}")


def run_probes(cfg):
    """-> {model label: {"position": [(R^2, shuffled R^2) per hidden state], "newline": [...]}}"""
    results = {}
    for pos, folder in model_dirs(POS_SCHEMES, cfg.checkpoints).items():
        model, tokenizer, ckpt = instruments.load(folder)
        print(f"pos={pos:<11} {instruments.describe(folder, ckpt)}")
        windows = instruments.validation_windows(ckpt, cfg.windows)
        newline = tokenizer.encode("\n")[0]
        signal = any(overrides(model.transformer.wpe, h) for h in ("embed", "rotation", "score_bias"))
        masks = {pos: True} | ({} if signal else {NOPE_UNMASKED: False})  # NoPE unmasked too: the mask's only
        for label, mask in masks.items():
            results[label] = instruments.probe_positions(model, windows, newline, mask=mask, ridge=cfg.ridge)
    return results


def draw(results, path):
    """R^2 per layer, one line per model, its shuffled baseline dotted in the same colour."""
    fig, axes = instruments.pyplot().subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, target in zip(axes, TARGETS):
        for i, (label, result) in enumerate(results.items()):
            r2, shuffled = zip(*result[target])
            layers = range(len(r2))
            style = {"color": f"C{i}", "linestyle": "--" if label == NOPE_UNMASKED else "-"}
            ax.plot(layers, r2, marker="o", label=label, **style)
            ax.plot(layers, shuffled, color=f"C{i}", linestyle=":", linewidth=1)
        ax.set_xticks(list(layers), ["emb"] + [f"block {j}" for j in layers][1:])
        ax.axhline(0, color="grey", linewidth=0.5)
        ax.set(title=f"probe for {TARGETS[target]}", ylim=(-0.1, 1.02))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("held-out R$^2$ (dotted: shuffled targets)")
    axes[1].legend(loc="lower right", fontsize=8)
    fig.suptitle("Where does position live? Linear probes on the residual stream (T = 64)")
    instruments.save_figure(fig, path, "figure", tight=True)


def main(argv=None):
    with one_line_errors(PROG):
        given = set()
        cfg = ProbeConfig(**parse_flags(argv, PROG, __doc__, [("probe", ProbeConfig, None)], given=given))
        if "replace" in given and cfg.figure is None:  # ignored, it would look like a setting taking effect
            raise UserError("--replace applies to --figure only: leave it out, or give --figure", 2)
        drawing = cfg.figure is not None and instruments.check_figure_paths(
            "figure", [cfg.figure], cfg.replace, inputs_of(POS_SCHEMES, cfg.checkpoints)
        )
        instruments.use_one_thread()
        results = run_probes(cfg)
        for target, what in TARGETS.items():
            columns = [[f"{r2:.3f} ({base:+.3f})" for r2, base in results[x][target]] for x in results]
            print(f"\nR^2 of a linear probe for {what} (held-out windows), shuffled-target baseline in ()")
            print("\n".join(instruments.state_table(list(results), columns, 17)))
        if drawing:
            draw(results, cfg.figure)
            print(f"\nwrote {cfg.figure}")
        elif cfg.figure:
            note = "matplotlib is not installed (pip install matplotlib): no figure drawn"
            print(f"lab/demo/probe.py: {note}", file=sys.stderr)
    return results


if __name__ == "__main__":
    main()
