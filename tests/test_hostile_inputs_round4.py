"""Hostile inputs, round four: each input below, typed as a user would, gives one line on stderr naming its
entry point as typed, a non-zero exit status and no traceback, before any work starts. The table runs each
through the real entry point: main(argv) in-process where it can, a subprocess where the input is the way the
script is started, a signal or a resource limit."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import TINY_RUN, run_limited

import sample
import train
from data.common import BatchSampler
from lab import eval_length
from lab.demo import figures, permutation, probe
from lab.experiments import extrapolation, longlora, longrope
from lab.experiments import longrope_ablation as ablation
from lab.finetune import __main__ as finetune
from lab.perf import bench

ROOT = Path(__file__).resolve().parents[1]
ENV = os.environ | {"OMP_NUM_THREADS": "1"}


def one_line(err, prog):
    """stderr's only line, which begins `prog: error: `; no traceback."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), err
    return lines[0]


def in_process(capsys, main, argv):
    """main(argv) -> (its exit status, stderr, stdout)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out, err = capsys.readouterr()
    return exit_info.value.code, err, out


# every entry point inside a package, run as a file: the line names its `python -m` form
AS_FILES = {
    "lab/course/__main__.py": "lab.course",
    "data/fineweb_edu/prepare.py": "data.fineweb_edu.prepare",
    "data/passkey/prepare.py": "data.passkey.prepare",
    "data/shakespeare/prepare.py": "data.shakespeare.prepare",
    "data/shakespeare_char/prepare.py": "data.shakespeare_char.prepare",
    "data/text/prepare.py": "data.text.prepare",
    "lab/demo/figures.py": "lab.demo.figures",
    "lab/eval_length.py": "lab.eval_length",
    "lab/finetune/__main__.py": "lab.finetune",
    "lab/demo/permutation.py": "lab.demo.permutation",
    "lab/demo/probe.py": "lab.demo.probe",
    "lab/experiments/extrapolation.py": "lab.experiments.extrapolation",
    "lab/experiments/findings.py": "lab.experiments.findings",
    "lab/experiments/longlora.py": "lab.experiments.longlora",
    "lab/experiments/longrope.py": "lab.experiments.longrope",
    "lab/experiments/longrope_ablation.py": "lab.experiments.longrope_ablation",
    "lab/perf/ab.py": "lab.perf.ab",
    "lab/perf/bench.py": "lab.perf.bench",
    "lab/perf/threads.py": "lab.perf.threads",
}


def test_every_entry_point_in_a_package_is_in_the_table():
    """A new `python -m` entry point gets the same guard (and a row above)."""
    found = {
        path.relative_to(ROOT).as_posix()
        for folder in ("lab", "data")
        for path in (ROOT / folder).rglob("*.py")
        if 'if __name__ == "__main__"' in path.read_text()
    }
    assert found == set(AS_FILES)


@pytest.mark.parametrize("path", sorted(AS_FILES))
def test_an_entry_point_run_as_a_file_names_its_module_form(path):
    done = subprocess.run(
        [sys.executable, path, "--help"], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=60
    )
    line = one_line(done.stderr, path)
    assert done.returncode == 1 and line.endswith(
        f"run it from the repository root as `python -m {AS_FILES[path]}`"
    )


THREADS = {
    "train.py": train.main,
    "python -m lab.eval_length": eval_length.main,
    "python -m lab.perf.bench": bench.main,
}


@pytest.mark.parametrize("threads", ["¹", "٣", "３"])
@pytest.mark.parametrize("prog", sorted(THREADS))
def test_threads_takes_ascii_digits_only(capsys, prog, threads):
    """str.isdigit() takes a superscript one and other scripts' digits; int() refuses or reads them."""
    argv = [f"--threads={threads}", "--device=cpu"] + (
        ["out/none"] if prog == "python -m lab.eval_length" else []
    )
    status, err, out = in_process(capsys, THREADS[prog], argv)
    line = one_line(err, prog)
    assert status == 2 and f"--threads={threads}: give auto or a number of threads from 1 to" in line


# ---- inputs on a tiny trained run


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny runs of two steps: rope (block_size TINY_BLOCK), t5, and rope with LoRA adapters."""
    root = tmp_path_factory.mktemp("runs")
    for name, flags in {
        "rope": ["--pos=rope"],
        "t5": ["--pos=t5"],
        "lora": ["--pos=rope", "--lora_rank=2", f"--init_from={root / 'rope'}"],  # a fine-tune of rope
    }.items():
        main = finetune.main if name == "lora" else train.main
        main([*TINY_RUN, *flags, f"--out_dir={root / name}"])
    return root


def damaged(runs, tmp_path, name, change):
    """A copy of run `name`'s folder whose ckpt.pt is changed by change(ckpt) -> the folder."""
    folder = tmp_path / f"{name}_damaged"
    folder.mkdir()
    ckpt = torch.load(runs / name / "ckpt.pt", weights_only=True)
    torch.save(change(ckpt), folder / "ckpt.pt")
    return folder


def without(entry, key):
    return lambda ckpt: ckpt | {entry: {k: v for k, v in ckpt[entry].items() if k != key}}


def replaced(entry, key, value):
    return lambda ckpt: ckpt | {entry: ckpt[entry] | {key: value}}


def mis_shaped_adapter(ckpt):
    state = ckpt["lora"]["state"] | {"transformer.h.0.attn.c_attn.lora_A": torch.zeros(1, 16)}
    return ckpt | {"lora": {"state": state}}


def foreign_csv(path, header="a,b\n1,2\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(header)
    return path


FINETUNE = "python -m lab.finetune"
EVAL, ABLATION = "python -m lab.eval_length", "python -m lab.experiments.longrope_ablation"
LONGROPE, LONGLORA = "python -m lab.experiments.longrope", "python -m lab.experiments.longlora"
STUDY_PROG, PERMUTATION = "python -m lab.experiments.extrapolation", "python -m lab.demo.permutation"
# (entry point as typed, its main, argv ({run}: the rope run, {t5}, {lora}, {tmp}), what the line says)
CASES = {
    "ablation tables missing": (
        ABLATION,
        "{run} --tables --results={tmp}/empty",
        "longrope_shakespeare_char_x4.csv: no such file; "
        "`python -m lab.experiments.longrope_ablation` writes it",
    ),
    "ablation tables foreign": (
        ABLATION,
        "{run} --tables --results={tmp}/foreign",
        "longrope_shakespeare_char_x4.csv: no column checkpoint, variant, search_seed, task, length, value",
    ),
    "longlora tables foreign": (
        LONGLORA,
        "--tables --results={tmp}/foreign",
        "longlora.csv: no column phase",
    ),
    "longlora tables header only": (
        LONGLORA,
        "--tables --results={tmp}/header",
        "longlora.csv: a header and no rows; `python -m lab.experiments.longlora` writes it",
    ),
    "figures foreign csv": (
        "python -m lab.demo.figures",
        "--only=extrapolation --csv={tmp}/foreign/extrapolation.csv --out={tmp}/figures",
        "extrapolation.csv: no column checkpoint, pos, block_size, length, loss",
    ),
    "search: no block_size": (
        LONGROPE,
        "{no_block_size}",
        "rope_damaged/ckpt.pt: not a usable checkpoint (KeyError: 'block_size')",
    ),
    "ablation: no block_size": (
        ABLATION,
        "{no_block_size}",
        "rope_damaged/ckpt.pt: not a usable checkpoint (KeyError: 'block_size')",
    ),
    "search: meta None": (
        LONGROPE,
        "{meta_none}",
        "rope_damaged/ckpt.pt: not a usable checkpoint (AttributeError: ",
    ),
    "search: n_hat past L": (
        LONGROPE,
        "{run} --n_hat=100000 --factor=4",
        "the length searched, L = 64: give an n_hat from 0 to 63",
    ),
    "search: short on plain": (
        LONGROPE,
        "{run} --short",
        "--short searches the short factors of a run extended by its rope_factor s > 1",
    ),
    "lora: no state": (FINETUNE, "{lora_no_state}", "ckpt.pt: not a usable checkpoint (KeyError: 'state')"),
    "lora: a string": (FINETUNE, "{lora_string}", "ckpt.pt: not a usable checkpoint (TypeError: "),
    "lora: an adapter mis-shaped": (
        FINETUNE,
        "{lora_rank_string}",
        "does not fit (mis-shaped transformer.h.0.attn.c_attn.lora_A (1, 16)",
    ),
    "t5: rope_scalings": (
        EVAL,
        "{t5} --rope_scalings yarn --lengths=1,2",
        "--rope_scalings=yarn extends RoPE; no checkpoint takes it: ",
    ),
    "a list flag before the run": (
        EVAL,
        "--rope_scalings yarn {run} --lengths=1",
        "--rope_scalings takes every word after it: give checkpoints before it",
    ),
    "study: a device it cannot use": (
        STUDY_PROG,
        "--device=cuda --quick --out_root={tmp}/o --results={tmp}/r",
        "device='cuda' but torch.cuda.is_available() is False",
    ),
    "demo: no run of any scheme": (
        PERMUTATION,
        "--checkpoints={tmp}/empty_runs",
        "no checkpoint of pos=learned,sinusoidal,rope,alibi,none,t5,fire in",
    ),
}
LORA_RESUME = [*TINY_RUN, "--pos=rope", "--lora_rank=2", "--resume", "--max_iters=4", "--out_dir={folder}"]


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_hostile_input_is_one_line_before_any_work(runs, tmp_path, capsys, case):
    prog, argv, words = CASES[case]
    if "cuda" in CASES[case][1] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    (tmp_path / "empty_runs").mkdir()
    mains = {
        EVAL: eval_length.main,
        STUDY_PROG: extrapolation.main,
        PERMUTATION: permutation.main,
        ABLATION: ablation.main,
        LONGROPE: longrope.main,
        LONGLORA: longlora.main,
        "python -m lab.demo.figures": figures.main,
        FINETUNE: finetune.main,
    }
    foreign_csv(tmp_path / "foreign" / "longrope_shakespeare_char_x4.csv")
    foreign_csv(tmp_path / "foreign" / "longlora.csv")
    foreign_csv(tmp_path / "foreign" / "extrapolation.csv")
    foreign_csv(tmp_path / "header" / "longlora.csv", ",".join(longlora.CSV_COLUMNS) + "\n")
    foreign_csv(tmp_path / "header" / "longlora_cost.csv", ",".join(longlora.COST) + "\n")
    folders = {
        "no_block_size": lambda: damaged(runs, tmp_path, "rope", without("model_config", "block_size")),
        "meta_none": lambda: damaged(runs, tmp_path, "rope", lambda ckpt: ckpt | {"meta": None}),
        "lora_no_state": lambda: damaged(runs, tmp_path, "lora", without("lora", "state")),
        "lora_string": lambda: damaged(runs, tmp_path, "lora", lambda ckpt: ckpt | {"lora": "adapters"}),
        "lora_rank_string": lambda: damaged(runs, tmp_path, "lora", mis_shaped_adapter),
    }
    for name, make in folders.items():
        if "{" + name + "}" in argv:
            folder = make()
            argv = argv.replace(
                "{" + name + "}",
                " ".join(LORA_RESUME).format(folder=folder) if name.startswith("lora") else str(folder),
            )
    argv = argv.format(run=runs / "rope", t5=runs / "t5", tmp=tmp_path).split()
    before = sorted(tmp_path.rglob("*"))
    status, err, out = in_process(capsys, mains[prog], argv)
    line = one_line(err, prog)
    assert status in (1, 2) and words in line, line
    assert sorted(tmp_path.rglob("*")) == before  # nothing written
    assert "resuming" not in out and "tokens/step" not in out  # refused before the run starts


def nan_weights(ckpt):
    ckpt["model"]["lm_head.weight"][0, 0] = float("nan")
    return ckpt


def without_newline(ckpt):
    """A vocabulary whose newline is another character: the default prompt cannot be encoded."""
    chars = ["~" if c == "\n" else c for c in ckpt["meta"]["chars"]]
    return ckpt | {"meta": ckpt["meta"] | {"chars": chars}}


@pytest.mark.parametrize(
    "change, words",
    [
        (nan_weights, "weights that are not finite"),
        (without_newline, "the default prompt, a newline, is not in"),
    ],
)
def test_compare_checks_every_checkpoint_before_the_first_sample(runs, tmp_path, capsys, change, words):
    second = damaged(runs, tmp_path, "rope", change)
    argv = ["--compare", str(runs / "rope"), str(second), "--max_new_tokens=4", "--device=cpu"]
    status, err, out = in_process(capsys, sample.main, argv)
    line = one_line(err, "sample.py")
    assert status == 1 and words in line and str(second) in line
    assert "===" not in capsys.readouterr().out  # nothing sampled


def test_an_empty_compare_is_refused(runs, capsys):
    status, err, out = in_process(capsys, sample.main, [f"--out_dir={runs / 'rope'}", "--compare"])
    assert status == 2 and "--compare is empty" in one_line(err, "sample.py")


def test_a_checkpoint_after_a_flag_is_taken(runs, capsys):
    rows = eval_length.main(["--lengths", "1,2", str(runs / "rope"), "--max_windows=1", "--device=cpu"])
    assert {row.checkpoint for row in rows} == {str(runs / "rope")}


def test_a_full_disk_is_one_line_before_a_checkpoint_is_read(runs, tmp_path):
    """No byte can be written (ulimit -f 0; SIGXFSZ ignored): torch finds no temporary folder once it reads
    a checkpoint, so the outputs are checked first, and say there is no space."""

    argv = [str(runs / "rope"), "--lengths=1", f"--csv={tmp_path / 'full.csv'}", "--device=cpu"]
    done = run_limited(0, "-m", "lab.eval_length", *argv)
    line = one_line(done.stderr, "python -m lab.eval_length")
    assert done.returncode == 1 and "no space left" in line and done.stdout == ""


# A signal to a study's own process (SIGINT as SIGTERM): tests/test_runs.py,
# test_a_signal_to_a_study_reaches_its_runs_which_save_before_it_stops


@pytest.mark.parametrize(
    "demo, flags", [(permutation, []), (probe, ["--windows=8"])], ids=["permutation", "probe"]
)
def test_a_demo_runs_on_the_schemes_whose_runs_are_there(runs, tmp_path, capsys, demo, flags):
    """A folder of runs from before some schemes existed: the demo shows those there and names the rest."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "rope").symlink_to(runs / "rope")
    demo.main([f"--checkpoints={tmp_path / 'runs'}", *flags])
    out = capsys.readouterr().out
    note = next(line for line in out.splitlines() if line.startswith("note: no checkpoint of pos="))
    assert "pos=learned,sinusoidal,alibi,none,t5,fire in" in note and note.endswith("showing rope")
    assert "pos=rope" in out


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_signal_inside_an_evaluation_leaves_the_resumed_figures_those_of_the_straight_run(
    tmp_path, monkeypatch, split
):
    """SIGTERM while the second evaluation draws its `split` batches (after its second): the run saves and
    stops; resumed, it evaluates that step again and every evaluation after, each equal to the straight
    run's. The evaluation stream is saved as it stood before the cut evaluation, not part-way."""
    flags = [*TINY_RUN, "--max_iters=6", "--eval_interval=2", "--eval_iters=3"]
    straight = {e["iter"]: e for e in train.main([*flags, f"--out_dir={tmp_path / 'straight'}"])["evals"]}
    draw, sent = BatchSampler.get_batch, []

    def get_batch(self, which):
        batch = draw(self, which)
        if self.rank == train.EVAL_STREAM and which == split and self.batches[split] == 3 + 2 and not sent:
            sent.append(os.kill(os.getpid(), signal.SIGTERM))  # the StopSignals handler takes it
        return batch

    monkeypatch.setattr(BatchSampler, "get_batch", get_batch)
    cut = train.main([*flags, f"--out_dir={tmp_path / 'cut'}"])
    assert sent and cut["stopped"] == "SIGTERM" and max(e["iter"] for e in cut["evals"]) == 0
    resumed = train.main([*flags, f"--out_dir={tmp_path / 'cut'}", "--resume"])
    assert [e["iter"] for e in resumed["evals"]] == [2, 4, 6]
    for e in resumed["evals"]:
        assert (e["train"], e["val"]) == (straight[e["iter"]]["train"], straight[e["iter"]]["val"]), e["iter"]


def test_compare_checks_gpt2_weights_before_the_first_sample(runs, capsys, monkeypatch):
    """GPT-2 second while offline: one line naming --compare, not --init_from, and no sample printed."""

    def offline(name):
        raise OSError("no connection to the Hugging Face Hub")

    monkeypatch.setattr("plumbing.checkpoint.download_gpt2", offline)
    argv = ["--compare", str(runs / "rope"), "gpt2", "--max_new_tokens=4", "--device=cpu"]
    status, err, out = in_process(capsys, sample.main, argv)
    assert status == 1 and one_line(err, "sample.py").endswith(
        "--compare=gpt2: no connection to the Hugging Face Hub"
    )
    assert "===" not in capsys.readouterr().out
