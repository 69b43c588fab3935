"""Helpers shared by the benchmark scripts: repeated timing, medians, typed JSON output.

A benchmark writes its figures through a :class:`Result` (a frozen dataclass whose fields are
the JSON keys, nested :class:`Record` dataclasses for its rows): ``Result.from_json`` refuses a
key the record does not declare and a declared key that is missing, so a renamed key fails when
the benchmark writes, and when the tests load every file under ``benchmarks/results/``.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
import time
import types
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

RESULTS = Path(__file__).resolve().parent / "results"
R = TypeVar("R", bound="Record")
T = TypeVar("T")


def time_median(
    fn: Callable[..., Any], repeats: int, setup: Callable[[], Any] | None = None
) -> float:
    """Median wall time of ``fn(setup())`` (or ``fn()``) over ``repeats`` runs, seconds."""
    times = []
    for _ in range(repeats):
        arg = setup() if setup is not None else None
        t0 = time.perf_counter()
        fn(arg) if setup is not None else fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_interleaved(
    fns: dict[str, Callable[..., Any]],
    repeats: int,
    setups: dict[str, Callable[[], Any]] | None = None,
) -> dict[str, float]:
    """Median seconds of each function, timed round-robin (A B C, B C A, ...) so that a burst
    of load on a shared machine hits every method alike. ``setups[name]()``, when given,
    builds the argument for ``fns[name]`` outside the timed region."""
    setups = setups or {}
    names = list(fns)
    times: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            arg = setups[name]() if name in setups else None
            t0 = time.perf_counter()
            fns[name](arg) if name in setups else fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(t) for n, t in times.items()}


def write_record(path: Path, kind: Any, data: Any, *, indent: int = 2) -> Path:
    """Write ``data`` to ``path`` as the JSON of its record ``kind`` (a :class:`Result`, or
    ``list[Row]`` for a bare list), checked on the way: a key the record lacks, or a field the
    data lacks, is a ValueError naming it. The data is then kept in ``<path>.unmatched.json``,
    so a long run's figures are not lost to a schema slip."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        record = decode(kind, data, path.stem)
    except ValueError as e:
        keep = path.with_suffix(".unmatched.json")
        keep.write_text(json.dumps(data, indent=indent, default=str))
        e.add_note(f"the figures are kept in {keep}; fix the record or the benchmark")
        raise
    tmp = path.with_suffix(".json.tmp")  # then renamed: a reader never sees half a file
    tmp.write_text(json.dumps(encode(record), indent=indent) + "\n")
    tmp.replace(path)
    return path


def write_json(name: str, kind: Any, data: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/<name>.json`` through its record ``kind``
    (:func:`write_record`) with machine facts attached."""
    machine = {"python": platform.python_version(), "processor": platform.machine()}
    body = {"machine": machine, **{k: v for k, v in data.items() if k != "machine"}}
    return write_record(RESULTS / f"{name}.json", kind, body)


# -- typed results: the JSON schema of each benchmark, as dataclasses ----------------------


def json_key(key: str, *, optional: bool = False) -> Any:
    """A field stored under a JSON key that is not a Python name (``t_to_0.9_s``);
    ``optional``: the key may be absent (then ``None``, and ``to_json`` leaves it out)."""
    meta = {"json": key, "optional": optional}
    return dataclasses.field(default=None, metadata=meta) if optional else dataclasses.field(
        metadata=meta)  # fmt: skip


def optional() -> Any:
    """A field whose key some files or rows lack: ``None`` then, and left out by ``to_json``
    (so a file round-trips unchanged)."""
    return dataclasses.field(default=None, metadata={"optional": True})


class Record:
    """Base of the frozen, keyword-only dataclasses that give a benchmark's JSON its schema.

    Field types drive the conversion: a nested ``Record``, ``list[X]``, ``dict[str, X]``,
    ``X | None``, ``X | Y`` (the first that fits: files written before a rename), ``int``,
    ``float`` (an int fits), ``str``, ``bool``, ``Any``.
    """

    @classmethod
    def from_json(cls: type[R], data: Any) -> R:
        """The record of ``data``; ValueError naming the path of an unknown, missing or
        mistyped key."""
        return decode(cls, data, cls.__name__)

    def to_json(self) -> dict[str, Any]:
        """The JSON object, keys in field order (``from_json``'s inverse)."""
        return encode(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Machine(Record):
    python: str
    processor: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result(Record):
    """A whole results file; ``machine`` is what :func:`write_json` stamps on it."""

    machine: Machine | None = optional()


def load_result(kind: type[T], name: str) -> T:
    """``benchmarks/results/<name>.json`` decoded as ``kind`` (a :class:`Result` or, for a
    file holding a bare list, ``list[Row]``)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run the benchmark that writes it")
    return decode(kind, json.loads(path.read_text()), name)


@cache
def _fields(kind: Any) -> list[tuple[str, str, Any, bool]]:
    """(attribute, JSON key, type, optional) per field of a record class."""
    hints = get_type_hints(kind)
    return [(f.name, f.metadata.get("json", f.name), hints[f.name],
             bool(f.metadata.get("optional"))) for f in dataclasses.fields(kind)]  # fmt: skip


def _decode_record(kind: type, value: Any, where: str) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {kind.__name__} needs a JSON object, got {value!r:.60}")
    fields = _fields(kind)
    keys = {key for _, key, _, _ in fields}
    unknown = [k for k in value if k not in keys]
    missing = [key for _, key, _, opt in fields if key not in value and not opt]
    if unknown or missing:
        raise ValueError(
            f"{where}: {kind.__name__} does not match the JSON: unknown keys {unknown}, missing "
            f"keys {missing}; rename the record's field or the key the benchmark writes"
        )
    return kind(**{name: decode(tp, value[key], f"{where}.{key}")
                   for name, key, tp, _ in fields if key in value})  # fmt: skip


def decode(kind: Any, value: Any, where: str) -> Any:
    """``value`` (parsed JSON) as ``kind``, checked; ``where`` names it in errors."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return value
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):  # a Record or a library result
        return _decode_record(kind, value, where)
    if origin is list:
        if not isinstance(value, list | tuple):  # a tuple (os.getloadavg()) is written as one
            raise ValueError(f"{where}: expected a list, got {value!r:.60}")
        return [decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object, got {value!r:.60}")
        return {k: decode(args[1], v, f"{where}.{k}") for k, v in value.items()}
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for alternative in (a for a in args if a is not type(None)):
            try:
                return decode(alternative, value, where)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(" / ".join(errors))
    wanted = (int, float) if kind is float else kind
    if not isinstance(value, wanted) or (kind is not bool and isinstance(value, bool)):
        raise ValueError(f"{where}: expected {kind.__name__}, got {value!r:.60}")
    return value


def encode(value: Any) -> Any:
    """A record (or list, dict, scalar of them) as plain JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        kind: Any = type(value)
        return {key: encode(getattr(value, name))
                for name, key, _, opt in _fields(kind)
                if not (opt and getattr(value, name) is None)}  # fmt: skip
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, dict):
        return {k: encode(v) for k, v in value.items()}
    return value


# -- the Zero Bubble paper's 12 configurations (tests/pipeline/data) ------------------------

PAPER_TABLE = RESULTS.parents[1] / "tests" / "pipeline" / "data" / "zb_iclr_bubble_table.csv"


def paper_rows(quick: bool = False) -> list[dict[str, str]]:
    """The paper table's rows (``quick``: only the p=8 ones)."""
    import csv

    rows = list(csv.DictReader(PAPER_TABLE.open()))
    return [r for r in rows if r["p"] == "8"] if quick else rows


def paper_costs(row: dict[str, str]) -> Any:
    """One row's per-rank costs and memory model (:meth:`CostModel.paper`)."""
    from nobubble.pipeline import CostModel

    return CostModel.paper(
        int(row["p"]), t_f=float(row["T_F_ms"]), t_b=float(row["T_B_ms"]),
        t_w=float(row["T_W_ms"]), t_comm=float(row["T_comm_ms"]),
        hidden=int(row["hidden"]), heads=int(row["heads"]), seq=int(row["seq"]),
    )  # fmt: skip


def print_bubble_memory(names: tuple[str, ...], results: list[dict[str, Any]]) -> None:
    """Per configuration and schedule: bubble rate (peak activation memory, rank units)."""
    from nobubble.bench.output import print_table

    print_table("bubble rate (peak activation memory, rank units)", ["model", "p", "m", *names],
                [[r["model"], r["p"], r["m"], *(f"{r['schedules'][n]['bubble_rate']:.2%} "
                  f"({r['schedules'][n]['peak_memory']:.2f})" for n in names)]
                 for r in results])  # fmt: skip
