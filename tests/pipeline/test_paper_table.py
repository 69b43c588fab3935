"""The Zero Bubble paper's bubble table (ICLR 2024), reproduced by our generators + simulator.

Data: tests/pipeline/data/zb_iclr_bubble_table.csv (source named in data/README.md).
"""

from __future__ import annotations

import pytest

from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate
from tests.pipeline.paper_table import ROWS, paper_costs


def _ids(row):
    return f"{row['model']}-p{row['p']}-m{row['m']}"


@pytest.mark.parametrize("row", ROWS, ids=_ids)
@pytest.mark.parametrize(("name", "column"), [("1f1b", "bubble_1f1b"), ("zb-h1", "bubble_zb_h1"),
                                              ("zb-h2", "bubble_zb_h2")])  # fmt: skip
def test_handcrafted_rows(row, name, column):
    p, m = int(row["p"]), int(row["m"])
    result = simulate(get_schedule(name, num_stages=p, num_microbatches=m), paper_costs(row))
    assert abs(result.bubble_rate - float(row[column])) <= 0.0005


@pytest.mark.parametrize("row", ROWS, ids=_ids)
@pytest.mark.parametrize(("name", "column", "factor"), [("zb-1p", "bubble_zb_1p", 1),
                                                        ("zb-2p", "bubble_zb_2p", 2)])  # fmt: skip
def test_automatic_rows(row, name, column, factor):
    """ZB-1p / ZB-2p: no worse than published, activation memory within factor * p * M_F."""
    p, m = int(row["p"]), int(row["m"])
    costs = paper_costs(row)
    result = simulate(get_schedule(name, num_stages=p, num_microbatches=m, costs=costs), costs)
    assert result.bubble_rate <= float(row[column]) + 0.0005
    limit = factor * p * costs.mem_f[0]
    assert max(result.peak_memory) <= limit * (1 + 1e-9)


@pytest.mark.parametrize(("model", "expected_in_seed_range"), [("1.5B", True), ("6.2B", False)])
def test_zb2p_throughput_gain_at_p8_m24(model, expected_in_seed_range):
    """The commonly quoted claim: ZB gives 15-30% more throughput than 1F1B at P=8, M=24. With the paper's
    costs, the gain implied by the *published* bubble rates is (1 - b_1f1b) / (1 - b_zb2p)
    (same work per step): our compare must reproduce it. 1.5B lands inside the claim (+26%);
    6.2B slightly above it (+30.3%)."""
    from nobubble.pipeline.compare import compare_schedules

    row = next(r for r in ROWS if r["model"] == model and r["p"] == "8" and r["m"] == "24")
    rows = compare_schedules(paper_costs(row), num_stages=8, num_microbatches=24,
                             names=("1f1b", "zb-2p"), include_torch=False)  # fmt: skip
    gain = next(r.throughput_vs_1f1b for r in rows if r.name == "zb-2p")
    published = (1 - float(row["bubble_zb_2p"])) / (1 - float(row["bubble_1f1b"]))
    assert gain == pytest.approx(published, abs=0.002)
    assert (0.15 <= gain - 1 <= 0.30) is expected_in_seed_range
