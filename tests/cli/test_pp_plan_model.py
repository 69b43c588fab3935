"""``nobubble pp plan | run --model MODULE:FACTORY``: a user's model planned, then run on 2 ranks
with the loss of the same model computed by torch alone in this process."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch
from torch import nn

from nobubble.cli import main
from nobubble.pipeline.plan import BlockCosts, Plan, plan_from_costs

FACTORY = """
import torch
from torch import nn

VOCAB, WIDTH = 32, 16


def loss_fn(logits, targets):
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def factory():
    layers = [nn.TransformerEncoderLayer(WIDTH, 2, 2 * WIDTH, dropout=0.0, batch_first=True)
              for _ in range(4)]
    ids = torch.randint(0, VOCAB, (8, 9), generator=torch.Generator().manual_seed(1))
    return [nn.Embedding(VOCAB, WIDTH), *layers, nn.Linear(WIDTH, VOCAB)], ids[:, :-1], ids[:, 1:], loss_fn


def five_blocks():
    blocks, inputs, targets, fn = factory()
    return blocks[:4] + blocks[5:], inputs, targets, fn


def three_things():
    blocks, inputs, targets, fn = factory()
    return blocks, inputs, fn
"""


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "my_model.py"
    path.write_text(FACTORY)
    return path


def _reference_loss(path, seed: int = 0) -> float:
    """The whole model's loss on the whole batch, by torch alone (the CLI's default seed)."""
    spec = importlib.util.spec_from_file_location("reference_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(seed)
    blocks, inputs, targets, loss_fn = module.factory()
    with torch.no_grad():
        return float(loss_fn(nn.Sequential(*blocks)(inputs), targets))


def test_plan_writes_a_plan_that_runs_to_the_single_process_loss(model_file, tmp_path, capsys):
    out = tmp_path / "plan.json"
    rc = main(["pp", "plan", "--model", f"{model_file}:factory", "--ranks", "2", "--out", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    p = Plan.from_json(out.read_text())
    assert Plan.from_json(p.to_json()) == p and p.num_blocks == 6 and p.num_ranks == 2
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [line.split("│")[1:-1] for line in table.splitlines() if line.startswith("│")]
    first = [cell.strip() for cell in rows[0]]
    assert first[:5] == ["chosen", "+".join(map(str, p.stage_sizes())), p.schedule_name,
                         str(p.num_microbatches), "yes" if p.recompute[0] else "no"]  # fmt: skip
    assert rows[-1][0].strip() == "naive" and rows[-1][2].strip() == "1f1b"

    rc = main(["pp", "run", "--plan", str(out), "--model", f"{model_file}:factory", "--steps", "1",
               "--json"])  # fmt: skip
    assert rc == 0
    run = json.loads(capsys.readouterr().out)
    (loss,) = run["losses"]
    assert math.isfinite(loss)
    assert loss == pytest.approx(_reference_loss(model_file), rel=1e-5)
    assert run["predicted_step_ms"] == p.predicted_step_ms and run["step_ms"][0] > 0


def test_plan_json_and_predictions_match_the_planner(model_file, tmp_path, capsys):
    """The JSON lists the chosen plan first; the table's predictions are the planner's own;
    a memory limit keeps the chosen plan's peak under it."""
    out = tmp_path / "plan.json"
    args = ["pp", "plan", "--model", f"{model_file}:factory", "--ranks", "2", "-m", "4",
            "--out", str(out), "--json"]  # fmt: skip
    assert main(args) == 0
    shown = json.loads(capsys.readouterr().out)
    p = Plan.from_json(out.read_text())
    assert shown["chosen"]["stage_sizes"] == list(p.stage_sizes())
    assert shown["chosen"]["predicted_step_ms"] == p.predicted_step_ms
    assert {c.num_microbatches for c in p.candidates} == {4}
    for c in p.candidates:  # the plan rebuilds each candidate as the planner weighed it
        assert p.simulate(c).makespan == c.predicted_step_ms
    naive = shown["naive_1f1b"]
    assert naive["stage_sizes"] == [3, 3] and naive["schedule"] == "1f1b"
    assert naive["predicted_step_ms"] == p.weigh((3,), "1f1b").predicted_step_ms

    peaks = sorted({max(c.predicted_peak_bytes) for c in p.candidates})
    limit_mib = peaks[len(peaks) // 2] / 2**20  # bytes are measured, not timed: exact again
    assert main([*args, "--memory-limit-mib", f"{limit_mib!r}"]) == 0
    limited = json.loads(capsys.readouterr().out)["chosen"]
    assert max(limited["peak_mib_per_rank"]) <= limit_mib and limited["fits"]
    assert main([*args, "--memory-limit-mib", f"{peaks[0] / 2**20 / 2}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no candidate fits" in err


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("no_such_module_xyz:factory", "is not importable"),
        ("{dir}/missing.py:factory", "does not exist"),
        ("{file}:nope", "has no attribute 'nope'"),
        ("{file}:three_things", "returned a tuple of 3"),
        ("{file}:VOCAB", "is not a function"),
        ("{dir}/broken.py:factory", "importing it raised SyntaxError"),
        ("transformer", "give gpt or mlp"),
    ],
)
def test_a_bad_factory_exits_2_with_one_line(model, message, model_file, tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def factory(:\n")
    spec = model.format(dir=tmp_path, file=model_file)
    assert main(["pp", "plan", "--model", spec, "--ranks", "2", "--out",
                 str(tmp_path / "plan.json")]) == 2  # fmt: skip
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "plan.json").exists()


def test_run_refuses_a_plan_for_another_model_before_any_rank_starts(model_file, tmp_path,
                                                                     capsys):  # fmt: skip
    blocks = [BlockCosts(forward=1.0, backward_input=1.0, backward_weight=1.0,
                         activation_bytes=1e3, boundary_bytes=1e2)] * 6  # fmt: skip
    plan = tmp_path / "plan.json"
    plan.write_text(plan_from_costs(blocks, num_ranks=2, num_microbatches=4).to_json())
    run = ["pp", "run", "--plan", str(plan), "--steps", "1"]
    assert main([*run, "--model", f"{model_file}:five_blocks"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a plan for 6 blocks" in err and "returns 5" in err
    assert main([*run, "--model", f"{model_file}:factory", "--ranks", "3"]) == 2
    assert "a plan for 2 ranks" in capsys.readouterr().err
    assert main([*run, "--model", "gpt"]) == 2
    assert "--model MODULE:FACTORY" in capsys.readouterr().err
    plan.write_text("{}")
    assert main([*run, "--model", f"{model_file}:factory"]) == 2
    assert "not a plan JSON" in capsys.readouterr().err


def test_builtin_models_keep_their_commands(tmp_path, capsys):
    """``--model gpt|mlp`` is today's built-in model (as ``--arch``); a factory needs a plan."""
    args = ["pp", "profile", "--stages", "2", "--no-comm", "--repeats", "1", "--layers", "2",
            "--hidden", "16", "--json"]  # fmt: skip
    assert main([*args, "--model", "mlp"]) == 0
    assert json.loads(capsys.readouterr().out)["model"].startswith("mlp")
    assert main(["pp", "run", "-s", "1f1b", "-p", "2", "--model", "x.py:f"]) == 2
    assert "give --plan plan.json" in capsys.readouterr().err
    assert main(["pp", "run", "-s", "1f1b"]) == 2
    assert "--ranks is required" in capsys.readouterr().err
