"""Rows of a benchmark (dicts, column -> value) as a markdown table: what a script prints and what
docs/benchmarks.md shows, from the same rows."""
from __future__ import annotations

import math


def rounded(value: float | None, digits: int = 0) -> int | float | None:
    """A figure as its table shows it: None when missing (None or NaN), a whole number at 0 digits."""
    if value is None or math.isnan(value):
        return None
    return round(value, digits) if digits else round(value)


def cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, (int, float)):
        return f"{value:,}"  # as rounded by the script: 1,833 and 20.4
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown(rows: list[dict], transpose: bool = False) -> str:
    """A column per key (in the order they first appear), a line per row; transposed, a line per key
    and a column per row, the first key's values heading the columns (for a few rows of many measures)."""
    columns = list(dict.fromkeys(key for row in rows for key in row))
    lines = [[cell(row.get(column)) for column in columns] for row in rows]
    header = columns
    if transpose:
        header = [columns[0], *(line[0] for line in lines)]
        lines = [[column, *(line[i] for line in lines)] for i, column in enumerate(columns) if i > 0]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(line) + " |" for line in lines)])
