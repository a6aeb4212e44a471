"""The LongLoRA study's results files (`python -m lab.experiments.longlora`): its lengths, the columns of
longlora.csv and longlora_cost.csv, and their reading. Shared by the study and lab/experiments/findings.py,
which writes the docs' sentences from those CSVs: an entry point imports no other."""

from lab.experiments.runs import read_rows

PROG = "python -m lab.experiments.longlora"  # the study's command: the one that writes these files
T, EXTENSION, FIRST_SEED = 64, 4, 1337
LONG = EXTENSION * T
COST = ("method", "tokens", "trained params", "attention GFLOPs/step", "peak MiB (est.)", "ms/step")
CSV_COLUMNS = ("phase", "task", "seed", "setting", "learning_rate", "steps", "length", "value", "base")
# read_rows's numbers and blank of each file: the base's rows have no learning rate
CSV_NUMBERS = dict(seed=int, learning_rate=float, steps=int, length=int, value=float), ("learning_rate",)
COST_NUMBERS = {"tokens": int, COST[3]: float}, ()


def read_results(results):
    """(longlora.csv's rows, longlora_cost.csv's rows) under the folder results, each checked to be the
    study's."""
    return (
        read_rows(results / "longlora.csv", CSV_COLUMNS, PROG, *CSV_NUMBERS),
        read_rows(results / "longlora_cost.csv", COST, PROG, *COST_NUMBERS),
    )


def seed_values(rows, setting, task, length, steps=None, phase="report"):
    """{seed: value} of one phase's rows of one setting at a length (and at `steps`, unless None)."""
    return {
        int(r["seed"]): float(r["value"])
        for r in rows
        if r["phase"] == phase
        and (r["setting"], r["task"], int(r["length"])) == (setting, task, length)
        and (steps is None or int(r["steps"]) == steps)
    }
