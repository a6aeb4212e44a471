"""Each package holds what its name says, and each rule the entry points share is written once.

plumbing/ and lab/measure/ import no entry point and take none of their types (train.py's Run and configs,
sample.py's Loaded); the rules "learned has no positions past its table" (the scheme's length_limit,
model.window_length) and "open a checkpoint, with a RoPE extension or without"
(plumbing.checkpoint.open_model) give the same answer through every entry point that uses them."""

import ast
import re
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

import sample
from lab import eval_length
from lab.measure import instruments
from model import GPT, GPTConfig
from plumbing.checkpoint import load_checkpoint
from positions import POS_SCHEMES, POSITION_MODULES, ROPE_SCALINGS, default_rope_factor

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = {"train", "sample", "lab.eval_length", "lab.perf.bench", "lab.perf.ab", "lab.perf.threads"}
SHARED = sorted([*ROOT.glob("plumbing/*.py"), *ROOT.glob("lab/measure/*.py")])
FIXTURE = ROOT / "tests" / "fixtures" / "ckpt_rope_without_finished.pt"  # RoPE, an older format


def imported(path):
    tree = ast.parse(path.read_text())
    names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    return names | {
        node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
    }


@pytest.mark.parametrize("path", SHARED, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_no_shared_module_imports_an_entry_point_or_takes_its_types(path):
    """An entry point's types (train.Run, train.TrainConfig, sample.Loaded) named in a shared module would be
    an import in disguise: the dependency pointing from the shared code up to a script."""
    assert imported(path) & ENTRY_POINTS == set()
    assert re.findall(r"\b(?:train|sample|eval_length)\.[A-Z]\w*", path.read_text()) == []


PACKAGES = ("data", "plumbing", "lab.finetune", "lab.measure", "lab.experiments", "lab.perf", "lab.course",
            "lab.demo")  # fmt: skip
MODULES = ("positions", "model", "generation")  # the top-level modules the packages may build on
LEAVES = ("plumbing.fields",)  # modules under every layer, positions.py included: they import no other


def node_of(name):
    """The leaf, package of PACKAGES or module of MODULES a dotted module name belongs to, or None."""
    nodes = LEAVES + PACKAGES + MODULES  # a leaf first: it is a node of its own, not of its package
    return next((node for node in nodes if name == node or name.startswith(node + ".")), None)


def import_graph():
    """{package, top-level module or leaf: the others of the repo it imports}, read from every import in its
    files (inside functions too), nothing imported; a leaf is a node of its own, not of its package."""
    graph, nodes = {}, PACKAGES + MODULES + LEAVES
    leaf_paths = [ROOT / f"{leaf.replace('.', '/')}.py" for leaf in LEAVES]
    for node in nodes:
        if node in PACKAGES:  # its leaves are nodes of their own
            paths = [p for p in sorted((ROOT / node.replace(".", "/")).rglob("*.py")) if p not in leaf_paths]
        else:
            paths = [ROOT / f"{node.replace('.', '/')}.py"]
        found = {node_of(name) for path in paths for name in imported(path)}
        graph[node] = sorted(found - {None, node})
    return graph


def test_a_leaf_imports_nothing_of_the_repository():
    assert [import_graph()[leaf] for leaf in LEAVES] == [[] for _ in LEAVES]


def cycle(graph):
    """One import cycle of graph, as the list of its nodes (first repeated last), or None."""
    state = {}  # node -> "open" while its imports are followed, "done" after

    def visit(node, path):
        state[node] = "open"
        for other in graph[node]:
            if state.get(other) == "open":
                return path[path.index(other) :] + [node, other]
            if other not in state and (found := visit(other, path + [node])):
                return found
        state[node] = "done"

    return next((found for node in graph if node not in state and (found := visit(node, []))), None)


def test_cycle_finds_a_cycle_and_only_a_cycle():
    """The check below can fail: a loop of three is found, a diamond is not a cycle."""
    assert cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert cycle({"a": ["b", "c"], "b": ["d"], "c": ["d"], "d": []}) is None


def test_the_packages_import_each_other_without_a_cycle():
    """Each package stands on those below it: none can be read, tested or forked without its importers."""
    assert cycle(import_graph()) is None, import_graph()


def compares_pos_to_learned(path):
    """Comparisons with the string "learned" in a module: where it would test for the table's limit itself."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Compare)
        and any(isinstance(c, ast.Constant) and c.value == "learned" for c in [node.left, *node.comparators])
    ]


@pytest.mark.parametrize("pos", POS_SCHEMES)
def test_learned_past_its_table_is_one_rule_through_every_entry_point(pos):
    """The scheme's length_limit says where its positions end; the model (and so generation and
    lab.measure.losses, which read model.length_limit) and eval_length's rows follow it."""
    config = GPTConfig.from_flat(pos=pos, block_size=8, n_layer=1, n_head=2, n_embd=16, vocab_size=11)
    limit = POSITION_MODULES[pos](config).length_limit
    assert GPT(config).length_limit == limit
    assert pos != "learned" or limit == config.block_size  # learned's: its table
    source = eval_length.Source("x", Path("x.pt"), {"model_config": asdict(config)}, None)
    assert source.limit == limit
    assert eval_length.available(source, "plain", 2 * config.block_size) == (limit is None)
    assert eval_length.available(source, "plain", config.block_size)
    assert ("window" in source.methods(ROPE_SCALINGS)) == (limit is not None)


def test_no_entry_point_or_measure_writes_the_table_rule_again():
    """sample.py, lab/eval_length.py and lab/measure/ ask the scheme's length_limit, never pos == "learned",
    whether a model has positions past its table (the four-term split of qk_terms is about learned's
    embedding, not its length)."""
    paths = [
        ROOT / "sample.py",
        ROOT / "lab/eval_length.py",
        ROOT / "lab" / "measure" / "losses.py",
        ROOT / "lab" / "measure" / "retrieval.py",
    ]
    assert {path.name: compares_pos_to_learned(path) for path in paths} == {path.name: [] for path in paths}


@pytest.mark.parametrize("scaling", [None, *ROPE_SCALINGS])
def test_sample_eval_length_and_the_demos_open_a_checkpoint_alike(scaling):
    """plumbing.checkpoint.open_model is the one opener: sample.py (load), lab/eval_length.py (model_for) and
    the demos (instruments.load) build the same model from the same file, with the same RoPE extension at the
    same default factor (positions.default_rope_factor), and it gives the same logits."""
    ckpt = load_checkpoint(FIXTURE, mmap=True)
    T = ckpt["model_config"]["block_size"]
    length = 4 * T
    source = eval_length.open_source(str(FIXTURE), task="passkey")  # the checkpoint alone, no dataset read
    by_eval_length = eval_length.model_for(source, scaling or "plain", length, "cpu")
    by_sample = sample.load(FIXTURE, "cpu", scaling, default_rope_factor(length, T)).model
    assert by_eval_length.config == by_sample.config
    if scaling is not None:
        assert (by_sample.config.pos_settings.rope_scaling, by_sample.config.pos_settings.rope_factor) == (
            scaling,
            4.0,
        )
    else:
        assert by_sample.config == instruments.load(FIXTURE)[0].config
    x = torch.randint(0, by_sample.config.vocab_size, (1, length))
    with torch.no_grad():
        torch.testing.assert_close(by_eval_length(x)[0], by_sample(x)[0], rtol=0, atol=0)


def test_the_fine_tuning_methods_build_on_model_code_alone():
    """S²-Attn and LoRA (lab/finetune/s2.py, lora.py) import torch and the root modules only (positions,
    model): a fork takes them into its own training code; longlora.py and __main__.py join them to train.py's
    run as a train.TrainConfig subclass."""
    for path in [ROOT / "lab" / "finetune" / "s2.py", ROOT / "lab" / "finetune" / "lora.py"]:
        assert {node_of(name) for name in imported(path)} - {None, *MODULES} == set(), path.name
