"""A learning-rate schedule cut short: a preset's lr_decay_iters past --max_iters says so in one line at the
start, with the learning rate the run ends at and the flag that decays within it."""

import train

TINY = ["--n_layer=1", "--n_head=2", "--n_embd=16", "--block_size=16", "--batch_size=2", "--device=cpu"]
TINY += ["--compile=false", "--eval_iters=1", "--eval_interval=2", "--log_interval=1000", "--warmup_iters=0"]


def notes(capsys):
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: lr_decay_iters")]


def test_a_schedule_longer_than_the_run_warns_once_with_the_final_lr(tmp_path, capsys):
    train.main([*TINY, f"--out_dir={tmp_path / 'short'}", "--max_iters=2", "--lr_decay_iters=3000"])
    (note,) = notes(capsys)
    final_lr = train.get_lr(1, train.TrainConfig(max_iters=2, lr_decay_iters=3000, warmup_iters=0))
    assert f"lr_decay_iters=3000 > max_iters=2: the run ends at lr {final_lr:.3g}" in note
    assert "--lr_decay_iters=2 decays within the run" in note


def test_a_schedule_within_the_run_says_nothing(tmp_path, capsys):
    train.main([*TINY, f"--out_dir={tmp_path / 'whole'}", "--max_iters=2"])
    assert notes(capsys) == []


def schedule_notes(capsys, flag):
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith(f"note: {flag}")]


def test_a_warmup_longer_than_the_run_says_it_never_reaches_learning_rate(tmp_path, capsys):
    """--warmup_iters past --max_iters: the run ends still warming up; the note names both flags, the lr it
    ends at and a warmup within the run."""
    train.main([*TINY, f"--out_dir={tmp_path / 'warm'}", "--max_iters=4", "--warmup_iters=100"])
    (note,) = schedule_notes(capsys, "warmup_iters")
    final_lr = train.get_lr(3, train.TrainConfig(max_iters=4, warmup_iters=100))
    assert f"warmup_iters=100 > max_iters=4: the run ends at lr {final_lr:.3g}, never reaching" in note
    assert (
        "learning_rate=0.001" in note and "--warmup_iters=0 (a tenth of the run) warms up within it" in note
    )


def test_a_decay_ending_before_the_warmup_says_the_rate_jumps_to_min_lr(tmp_path, capsys):
    """--lr_decay_iters not past --warmup_iters: from the end of warmup the rate is min_lr at once, with no
    decay; the note names both flags, the step and a decay over the run."""
    train.main(
        [*TINY, f"--out_dir={tmp_path / 'jump'}", "--max_iters=4", "--warmup_iters=3", "--lr_decay_iters=2"]
    )
    (note,) = schedule_notes(capsys, "lr_decay_iters")
    assert note.startswith("note: lr_decay_iters=2 <= warmup_iters=3: the rate jumps from its warmup")
    assert (
        "to min_lr=0.0001 at step 3" in note and "--lr_decay_iters=4 decays over the rest of the run" in note
    )
    cfg = train.TrainConfig(max_iters=4, warmup_iters=3, lr_decay_iters=2)
    assert train.get_lr(2, cfg) > 0.5 * cfg.learning_rate and train.get_lr(3, cfg) == cfg.min_lr  # the jump


def test_a_warmup_and_decay_within_the_run_say_nothing(tmp_path, capsys):
    """A warmup shorter than the run and a decay past it: no note on either."""
    train.main([*TINY, f"--out_dir={tmp_path / 'whole'}", "--max_iters=4", "--warmup_iters=2"])
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith(("note: warmup_iters", "note: lr_decay_iters"))] == []
