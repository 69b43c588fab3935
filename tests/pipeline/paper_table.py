"""The Zero Bubble paper's bubble table (Qi et al., ICLR 2024) as rows, and each row's costs.

Data: tests/pipeline/data/zb_iclr_bubble_table.csv (source named in data/README.md), one
dict of strings per configuration (``model``, ``p``, ``m``, the measured ``T_*_ms`` and the
published ``bubble_*`` rates). Shared by ``test_paper_table`` and ``schedules/test_v_memory``.
"""

from __future__ import annotations

import csv
from pathlib import Path

from nobubble.pipeline.costs import CostModel

TABLE = Path(__file__).parent / "data" / "zb_iclr_bubble_table.csv"
ROWS = list(csv.DictReader(TABLE.read_text().splitlines()))


def paper_costs(row: dict[str, str]) -> CostModel:
    """The paper's measured per-stage times and its memory model for one row."""
    return CostModel.paper(
        int(row["p"]),
        t_f=float(row["T_F_ms"]), t_b=float(row["T_B_ms"]), t_w=float(row["T_W_ms"]),
        t_comm=float(row["T_comm_ms"]),
        hidden=int(row["hidden"]), heads=int(row["heads"]), seq=int(row["seq"]),
    )  # fmt: skip
