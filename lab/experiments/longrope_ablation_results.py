"""The LongRoPE search ablation's results files (`python -m lab.experiments.longrope_ablation`): their columns
and the cells of their rows. Shared by the ablation and lab/experiments/findings.py, which writes the docs'
sentences from those CSVs: an entry point imports no other."""

PROG = "python -m lab.experiments.longrope_ablation"  # the ablation's command: the one that writes its CSVs
COLUMNS = ("checkpoint", "variant", "search_seed", "task", "length", "value")
NUMBERS = dict(search_seed=int, length=int, value=float), ("search_seed",)  # read_rows's: YaRN's has no seed


def cells(rows, variant, task, length):
    """{(checkpoint, search seed): value}; YaRN and plain, which no search varies, under every search seed."""
    seeds = {r["search_seed"] for r in rows if r["search_seed"]}
    found = {}
    for r in rows:
        if (r["variant"], r["task"], int(r["length"])) == (variant, task, length):
            for seed in [r["search_seed"]] if r["search_seed"] else seeds:
                found[(r["checkpoint"], seed)] = float(r["value"])
    return found
