"""lab/eval_length.py as a user runs it: tiny checkpoints trained for two steps with train.py, measured at and
past their trained length. CPU, fixed seeds, no mocks."""

import csv
import importlib.util
import json
import math
import re

import pytest
import torch
from helpers import TINY_BLOCK, TINY_RUN, error_line

import train
from data.common import dataset_dir
from lab import eval_length
from lab.measure import length_plots
from lab.measure.losses import validation_tokens, window_losses, window_starts
from plumbing.checkpoint import build_model, checkpoint_path, load_checkpoint
from positions import POS_SCHEMES, POSITION_MODULES, ROPE_SCALINGS, takes

BLOCK = TINY_BLOCK
TINY = TINY_RUN
LENGTHS = "0.5,1,2,4"  # 8, 16, 32 and 64 tokens at T = 16
WINDOWS = 3
HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """One tiny checkpoint per scheme, and "extended": rope fine-tuned for 0 steps at 2 x T with YaRN, so that
    its model_config records rope_scaling (a context-extension run, as python -m lab.experiments.extrapolation
    makes)."""
    root = tmp_path_factory.mktemp("ckpts")
    out_dirs = {pos: str(root / pos) for pos in POS_SCHEMES}
    for pos, out_dir in out_dirs.items():
        train.main([*TINY, f"--pos={pos}", f"--out_dir={out_dir}"])
    out_dirs["extended"] = str(root / "extended")
    train.main(
        [
            "--init_from",
            out_dirs["rope"],
            f"--block_size={2 * BLOCK}",
            "--rope_scaling=yarn",
            "--rope_factor=2",
            "--max_iters=0",
            "--eval_iters=1",
            "--batch_size=4",
            "--device=cpu",
            "--compile=false",
            f"--out_dir={out_dirs['extended']}",
        ]
    )
    return out_dirs


@pytest.fixture(scope="module")
def measured(checkpoints, tmp_path_factory):
    """eval_length.main on every checkpoint at 0.5, 1, 2 and 4 x T. -> (rows, {output: path})"""
    out = tmp_path_factory.mktemp("eval")
    files = {"csv": out / "loss.csv", "positions_csv": out / "positions.csv"}
    if HAS_MATPLOTLIB:
        files["plot"] = out / "loss.png"
    bucket = ["--bucket=4"] if HAS_MATPLOTLIB else []  # its points are the plot's: refused without --plot
    rows = eval_length.main(
        [
            *checkpoints.values(),
            f"--lengths={LENGTHS}",
            f"--max_windows={WINDOWS}",
            "--batch_size=2",
            "--device=cpu",
            "--progress=false",
            *bucket,
            *[f"--{flag}={path}" for flag, path in files.items()],
        ]
    )
    return rows, files


def rows_of(rows, checkpoint):
    return {row.scaling: row for row in rows if row.checkpoint == checkpoint}


def not_available(row, length):
    return row.pos == "learned" and row.scaling == "plain" and length > row.block_size


def test_every_cell_is_finite_except_learned_past_its_table(measured):
    """Every loss, loss past T and standard error is a finite number over WINDOWS windows, except the
    documented gaps: learned's plain loss past T (it has no positions there) and loss_beyond at L <= T."""
    rows, _ = measured
    for row in rows:
        assert math.isfinite(row.reference)
        for length, m in row.measures.items():
            if not_available(row, length):
                assert (m.loss, m.loss_beyond, m.stderr, m.windows, m.positions) == (None, None, None, 0, [])
                continue
            assert (
                m.windows == WINDOWS and math.isfinite(m.loss) and math.isfinite(m.stderr) and m.stderr >= 0
            )
            assert (m.loss_beyond is None) == (length <= row.block_size)
            assert m.loss_beyond is None or math.isfinite(m.loss_beyond)


def test_rows_are_plain_plus_each_rope_extension_and_learned_window(measured, checkpoints):
    """RoPE gets a row per extension, learned a sliding-window row,
    a run that records its extension only its own."""
    rows, _ = measured
    assert list(rows_of(rows, checkpoints["rope"])) == ["plain", *ROPE_SCALINGS]
    assert list(rows_of(rows, checkpoints["learned"])) == ["plain", "window"]
    for pos in POS_SCHEMES:  # a scheme that neither rotates nor has a length limit: plain alone
        if not takes(POSITION_MODULES[pos], "rope_scaling") and pos != "learned":
            assert list(rows_of(rows, checkpoints[pos])) == ["plain"], pos
    extended = rows_of(rows, checkpoints["extended"])
    assert list(extended) == ["yarn"] and extended["yarn"].block_size == 2 * BLOCK
    assert extended["yarn"].label == "yarn x2 (as trained)"


def test_every_rope_scaling_at_factor_one_equals_plain_rope(measured, checkpoints):
    """At L <= T the factor is max(1, L / T) = 1, where linear, ntk, dynamic and yarn are plain RoPE: the same
    logits from the model functions, at any length for linear, ntk and yarn (their frequencies are plain at
    s = 1) and up to T for dynamic (whose base also grows with the length). So the table's rows show plain's
    losses at every position there (lab/eval_length.py reuses plain's measure instead of running the same
    model again)."""
    rows, _ = measured
    by_scaling = rows_of(rows, checkpoints["rope"])
    for scaling in ROPE_SCALINGS:
        for length in (BLOCK // 2, BLOCK):
            got, plain = by_scaling[scaling].measures[length], by_scaling["plain"].measures[length]
            torch.testing.assert_close(
                torch.tensor(got.positions), torch.tensor(plain.positions), rtol=1e-6, atol=0
            )
    path = checkpoint_path(checkpoints["rope"])
    ckpt = load_checkpoint(path)
    x = torch.randint(0, 65, (2, 3 * BLOCK), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = build_model(path, ckpt).eval()(x)[0]
        for scaling in ROPE_SCALINGS:
            n = BLOCK if scaling == "dynamic" else 3 * BLOCK
            scaled = build_model(path, ckpt, rope_scaling=scaling, rope_factor=1.0).eval()(x[:, :n])[0]
            torch.testing.assert_close(scaled, plain[:, :n], rtol=1e-6, atol=1e-6, msg=scaling)


def test_dynamic_ntk_equals_plain_rope_up_to_the_trained_length(checkpoints):
    """Dynamic NTK recomputes its base from the current length and leaves RoPE alone while L <= T, whatever
    its factor; past T it changes the frequencies (so the equality below T is not vacuous)."""
    path = checkpoint_path(checkpoints["rope"])
    ckpt = load_checkpoint(path)
    plain = build_model(path, ckpt).eval()
    dynamic = build_model(path, ckpt, rope_scaling="dynamic", rope_factor=4.0).eval()
    tokens = validation_tokens("shakespeare_char")

    def losses(model, length):
        return window_losses(model, tokens, length, window_starts(len(tokens), length, 4), 4, "cpu")

    for length in (1, BLOCK // 2, BLOCK):
        torch.testing.assert_close(losses(dynamic, length), losses(plain, length), rtol=0, atol=0)
    assert not torch.equal(losses(dynamic, 2 * BLOCK), losses(plain, 2 * BLOCK))


def test_learned_window_row_is_plain_within_the_table(measured, checkpoints):
    """Up to T learned's sliding window holds the whole context (evaluation.token_losses runs the plain
    forward there): its window row shows its plain row's losses, which lab/eval_length.py measures once."""
    rows, _ = measured
    learned = rows_of(rows, checkpoints["learned"])
    for length in (BLOCK // 2, BLOCK):
        assert learned["window"].measures[length].positions == learned["plain"].measures[length].positions


def test_per_position_curve_has_one_point_per_position(measured):
    """Each measure holds the mean loss at each of its L positions, whose mean is the measure's loss; the
    positions CSV has one line per position; the plot's curves average --bucket positions per point."""
    rows, files = measured
    for row in rows:
        for length, m in row.measures.items():
            if m.loss is not None:
                assert len(m.positions) == length
                assert sum(m.positions) / length == pytest.approx(m.loss, rel=1e-9)
    with open(files["positions_csv"], newline="") as f:
        lines = list(csv.DictReader(f))
    assert list(lines[0]) == list(eval_length.POSITION_COLUMNS)
    rope_4t = [int(line["position"]) for line in lines if line["scaling"] == "ntk" and line["length"] == "64"]
    assert rope_4t == list(range(4 * BLOCK))
    starts, points = length_plots.bucketed(list(range(10)), 4)
    assert starts == [0, 4, 8] and points == [1.5, 5.5, 8.5]


def test_csv_has_exactly_the_documented_columns(measured, checkpoints):
    """One line per (checkpoint, method, length): length in tokens, loss empty only for learned past T,
    loss_beyond empty exactly when L <= T."""
    rows, files = measured
    with open(files["csv"], newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        lines = [dict(zip(header, line)) for line in reader]
    assert header == [
        "checkpoint",
        "pos",
        "scaling",
        "block_size",
        "length",
        "loss",
        "loss_beyond",
        "stderr",
        "windows",
    ]
    assert len(lines) == len(rows) * 4
    assert {line["scaling"] for line in lines} == {"plain", "window", *ROPE_SCALINGS}
    for line in lines:
        length, block_size = int(line["length"]), int(line["block_size"])
        expected_lengths = [b * block_size // 2 for b in (1, 2, 4, 8)]
        assert length in expected_lengths
        learned_past_t = line["pos"] == "learned" and line["scaling"] == "plain" and length > block_size
        assert (line["loss"] == "") == learned_past_t
        assert (line["loss_beyond"] == "") == (length <= block_size or learned_past_t)
        assert int(line["windows"]) == (0 if learned_past_t else WINDOWS)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="--plot needs matplotlib")
def test_plot_is_written(measured):
    _, files = measured
    assert files["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_has_a_row_per_checkpoint_and_method_and_a_column_per_length(measured):
    """The markdown table: the lengths as given, loss (ratio to L = T) in each cell,
    n/a for learned past T."""
    rows, _ = measured
    lines = eval_length.loss_table(rows, eval_length.parse_lengths(LENGTHS)).splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == "| checkpoint | pos | T | method | 0.5x | 1x | 2x | 4x |"
    assert len(table) == 2 + len(rows)
    learned_plain = next(line for line in table if "| learned | 16 | plain |" in line)
    assert learned_plain.endswith("| n/a | n/a |") and "(1.00)" in learned_plain


def test_lengths_are_multiples_of_t_or_token_counts():
    """2, 8 and 32x are multiples of T; 64, 256 (bare, above 16) and 8t are token counts,
    as in --lengths 64,256."""
    lengths = eval_length.parse_lengths("0.5, 2x,8,32x,64,256,8t")
    assert [length.tokens(BLOCK) for length in lengths] == [8, 32, 128, 512, 64, 256, 8]
    assert [str(length) for length in lengths] == ["0.5x", "2x", "8x", "32x", "64t", "256t", "8t"]
    for text, message in [
        ("0", "below 1"),
        ("0t", "below 1"),
        ("-2x", "below 1"),
        ("2.5t", "whole number"),
        ("100.5", "whole number"),
        ("abc", "not a length"),
        ("1,,2", "not a length"),
    ]:
        with pytest.raises(ValueError, match=message):
            eval_length.parse_lengths(text)


@pytest.mark.parametrize(
    "text, message",
    [
        ("inf", "'inf' is not a length (not a finite number)"),  # not "below 1": it is not
        ("nan", "'nan' is not a length (not a finite number)"),
        ("-inf", "'-inf' is not a length (not a finite number)"),
        ("1e400t", "'1e400t' is not a length (not a finite number)"),
        ("1,2,1", "1 and 1 are one length; give each once"),  # the same column twice
        ("2,2x", "2 and 2x are one length"),
        ("64,64t", "64 and 64t are one length"),
    ],
)
def test_a_length_that_is_no_finite_number_or_is_given_twice_is_refused_as_such(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        eval_length.parse_lengths(text)


def test_user_errors_are_one_line(checkpoints, tmp_path, capsys):
    """A bad path, a file that is not a checkpoint, a length below one token: one line on stderr each."""
    assert "no such folder or checkpoint file" in error_line(
        capsys, eval_length, [str(tmp_path / "missing")], 1
    )
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    assert "junk.pt: not a usable checkpoint (" in error_line(capsys, eval_length, [str(junk)], 1)
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    assert "not a posgpt checkpoint" in error_line(capsys, eval_length, [str(tmp_path / "other.pt")], 1)
    assert "below 1" in error_line(capsys, eval_length, [checkpoints["rope"], "--lengths=0"], 2)
    assert "is 0 tokens, below 1" in error_line(  # a bad value, as --lengths=0 is: status 2
        capsys, eval_length, [checkpoints["rope"], "--lengths=0.01"], 2
    )
    assert "invalid choice: 'cubic'" in error_line(
        capsys, eval_length, [checkpoints["rope"], "--rope_scalings", "cubic"], 2
    )


def test_rope_factors_name_the_checkpoints_they_give_no_longrope_row(checkpoints, tmp_path, capsys):
    """--rope_factors beside a learned checkpoint and one fine-tuned with YaRN: a longrope row for plain RoPE,
    and one line, before the work, naming the two it gives none."""
    factors = tmp_path / "factors.json"
    table = {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "original_max_position_embeddings": BLOCK}
    factors.write_text(json.dumps(table))
    names = [checkpoints[name] for name in ("rope", "learned", "extended")]
    argv = [*names, "--lengths=2", "--max_windows=1", f"--rope_factors={factors}", "--rope_scalings=linear"]
    rows = eval_length.main([*argv, "--progress=false"])
    assert [(row.checkpoint, row.scaling) for row in rows if row.scaling == "longrope"] == [
        (names[0], "longrope")
    ]
    note = capsys.readouterr().out.splitlines()[0]
    assert note == (
        f"note: --rope_factors gives no longrope row to {names[1]} (pos=learned, not RoPE), "
        f"{names[2]} (measured at its own rope_scaling=yarn)"
    ), note


def test_rope_factors_name_a_rope_checkpoint_of_another_t_and_refuse_when_none_fits(
    checkpoints, tmp_path, capsys
):
    """Factors searched for T = BLOCK beside a RoPE run of 2 x BLOCK (a study's fine-tune): a longrope row for
    the first, the second named; alone, the second is refused before any row."""
    longer = tmp_path / "longer"
    train.main([*TINY_RUN, "--pos=rope", f"--block_size={2 * BLOCK}", f"--out_dir={longer}"])
    factors = tmp_path / "factors.json"
    table = {"short_factor": [1.0] * 4, "long_factor": [2.0] * 4, "original_max_position_embeddings": BLOCK}
    factors.write_text(json.dumps(table))
    capsys.readouterr()
    flags = [f"--lengths={4 * BLOCK}t", "--max_windows=1", f"--rope_factors={factors}", "--rope_scalings"]
    rows = eval_length.main([checkpoints["rope"], str(longer), *flags, "--progress=false"])
    assert [row.checkpoint for row in rows if row.scaling == "longrope"] == [checkpoints["rope"]]
    note = (
        f"note: --rope_factors gives no longrope row to {longer} (T = {2 * BLOCK}, the factors were searched"
    )
    assert capsys.readouterr().out.startswith(note)
    err = error_line(capsys, eval_length, [str(longer), *flags], 2)
    why = f"(T = {2 * BLOCK}, the factors were searched for {BLOCK})"
    assert err.endswith(f"gives no checkpoint a longrope row: {longer} {why}")


EVAL = ["--lengths=1", "--max_windows=1", "--device=cpu", "--progress=false"]  # the cheapest evaluation
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--depths=0.5"], "--depths applies to --task=passkey only"),
        (["--trials=50"], "--trials applies to --task=passkey only"),  # given at its default: still given
        (["--passkey_seed=3"], "--passkey_seed applies to --task=passkey only"),
        (["--bucket=5"], "--bucket applies to --plot with --task=loss only"),
        (["--replace"], "--replace applies to --csv, --positions_csv or --plot only"),
        (["--task=passkey", "--max_windows=2"], "--max_windows applies to --task=loss only"),
        (["--task=passkey", "--dataset=shakespeare_char"], "--dataset applies to --task=loss only"),
        (["--task=passkey", "--positions_csv=p.csv"], "--positions_csv applies to --task=loss only"),
    ],
)
def test_a_flag_given_that_the_task_or_outputs_do_not_read_is_refused(checkpoints, capsys, flags, message):
    """Ignored, it would look like a setting that took effect: one line, status 2, naming what reads it."""
    err = error_line(capsys, eval_length, [checkpoints["rope"], "--device=cpu", *flags], 2)
    assert message in err and "leave it out" in err


def test_a_checkpoint_given_twice_is_refused(checkpoints, capsys):
    """Its rows would be printed twice: refused as a bad value (status 2), by name or as folder and file."""
    rope = checkpoints["rope"]
    err = error_line(capsys, eval_length, [rope, rope, *EVAL], 2)
    assert err.endswith(f"{rope}: given twice; give each checkpoint once")
    best = checkpoint_path(rope)
    err = error_line(capsys, eval_length, [rope, str(best), *EVAL], 2)
    assert err.endswith(
        f"{best}: the same checkpoint as {rope} ({best.resolve()}); give each checkpoint once"
    )


def test_an_output_in_the_folder_of_the_dataset_it_reads_is_refused(checkpoints, capsys):
    """--csv at the dataset's meta.json, or at a new file beside it: the folder the evaluation has just read
    is an input, as the checkpoints are; one line, the folder as it was, with --replace too."""
    folder = dataset_dir(load_checkpoint(checkpoint_path(checkpoints["rope"]))["train_config"]["dataset"])
    before = {path: path.read_bytes() for path in folder.iterdir() if path.is_file()}
    try:
        for output in (folder / "meta.json", folder / "loss.csv"):
            for replace in ([], ["--replace"]):
                err = error_line(
                    capsys, eval_length, [checkpoints["rope"], *EVAL, f"--csv={output}", *replace], 1
                )
                assert err.endswith(
                    f"{folder.resolve()} is a folder this run reads; write the output outside it"
                )
        assert {path: path.read_bytes() for path in folder.iterdir() if path.is_file()} == before
    finally:  # a command that wrote there spoilt the dataset the other tests read: put it back
        for path in (path for path in folder.iterdir() if path.is_file() and path not in before):
            path.unlink()
        for path, data in before.items():
            if path.read_bytes() != data:
                path.write_bytes(data)


def test_an_output_replaces_a_file_this_command_wrote_and_no_other_unless_replace(
    checkpoints, tmp_path, capsys
):
    """A file of the user's at --csv, --positions_csv or --plot (a script, a CSV of other columns, text named
    .png) is refused in one line and kept; --replace replaces it; the command's own CSV or figure is replaced
    again without a flag, the normal rerun (as the studies replace their results)."""
    script, other = tmp_path / "train.py", tmp_path / "other.csv"
    script.write_text("print('mine')\n")
    other.write_text("checkpoint,loss\nearlier run,1.5\n")
    argv = [checkpoints["rope"], *EVAL]
    for flag, path in (("csv", script), ("positions_csv", other)):
        err = error_line(capsys, eval_length, [*argv, f"--{flag}={path}"], 1)
        assert err.endswith(
            f"--{flag}={path}: that file exists and is no earlier output of this command (not a CSV with the "
            "header this command writes); give another file, or add --replace to replace it"
        )
    assert (
        script.read_text() == "print('mine')\n" and other.read_text() == "checkpoint,loss\nearlier run,1.5\n"
    )
    eval_length.main([*argv, f"--csv={script}", "--replace"])
    assert script.read_text().splitlines()[0] == ",".join(eval_length.CSV_COLUMNS)
    own = {"csv": tmp_path / "loss.csv", "positions_csv": tmp_path / "positions.csv"}
    for _ in range(2):  # written, then written again over its own
        eval_length.main([*argv, *(f"--{flag}={path}" for flag, path in own.items())])
    assert own["positions_csv"].read_text().splitlines()[0] == ",".join(eval_length.POSITION_COLUMNS)
    if HAS_MATPLOTLIB:
        picture = tmp_path / "loss.png"
        picture.write_text("not a picture\n")
        capsys.readouterr()
        assert "(not a .png image)" in error_line(capsys, eval_length, [*argv, f"--plot={picture}"], 1)
        assert picture.read_text() == "not a picture\n"
        picture.unlink()
        for _ in range(2):
            eval_length.main([*argv, f"--plot={picture}"])
        assert picture.read_bytes().startswith(PNG)


@pytest.mark.skipif(not HAS_MATPLOTLIB, reason="figures need matplotlib")
def test_a_figure_is_taken_for_an_earlier_output_in_each_format_matplotlib_writes(tmp_path):
    """lab.outputs.figure_file knows each format's first bytes: a figure saved in it is an earlier output (a
    rerun replaces it), a text file of that name is not."""
    from lab.measure.instruments import pyplot
    from lab.outputs import FIGURE_STARTS, figure_file

    fig, checked = pyplot().figure(figsize=(1, 1)), []
    for fmt in FIGURE_STARTS:
        path, text = tmp_path / f"figure.{fmt}", tmp_path / f"text.{fmt}"
        try:
            fig.savefig(path, format=fmt)
        except RuntimeError:  # pgf with text to typeset needs LaTeX
            continue
        text.write_text("notes\n")
        _, ours = figure_file(fmt)
        assert ours(path) and not ours(text), fmt
        checked.append(fmt)
    assert {"png", "pdf", "svg"} <= set(checked)
