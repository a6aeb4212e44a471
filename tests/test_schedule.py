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
