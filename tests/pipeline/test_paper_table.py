"""The Zero Bubble paper's bubble table (ICLR 2024), reproduced by our generators + simulator.

Data: tests/pipeline/data/zb_iclr_bubble_table.csv (source named in data/README.md).
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from nobubble.pipeline.costs import CostModel
from nobubble.pipeline.schedules import get_schedule
from nobubble.pipeline.simulate import simulate

TABLE = Path(__file__).parent / "data" / "zb_iclr_bubble_table.csv"
ROWS = list(csv.DictReader(TABLE.open()))


def paper_costs(row) -> CostModel:
    return CostModel.paper(
        int(row["p"]),
        t_f=float(row["T_F_ms"]), t_b=float(row["T_B_ms"]), t_w=float(row["T_W_ms"]),
        t_comm=float(row["T_comm_ms"]),
        hidden=int(row["hidden"]), heads=int(row["heads"]), seq=int(row["seq"]),
    )  # fmt: skip


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
