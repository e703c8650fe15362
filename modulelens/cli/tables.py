"""Tables that fit the terminal without cutting what the next command needs.

A :class:`FittedTable` is laid out when rich renders it, for the width it is given
(:func:`fit_columns` is the pure layout):

1. every column at its natural width, when that fits;
2. otherwise shrinkable columns take their shorter forms (a :class:`Cell` lists its forms longest
   first, e.g. ``[8,32,64] [64] [64]`` then ``[8,32,64] …``) and free text wraps;
3. while that is still too wide, optional columns are dropped, the lowest ``drop`` first;
4. as a last resort shrinkable cells are cut with an ellipsis and free text wraps narrower.

Key columns (ids, references, operator names: what one types next) are never cut, wrapped or
dropped. When they alone do not fit, the table is wider than the terminal (the terminal wraps the
line; the id stays whole), so print it with ``crop=False``. ``wide=True`` shows every column in
full. Cells are plain text (never rich markup). A rule under the header is drawn only on a
terminal; colours follow the console, which honours ``NO_COLOR``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.padding import Padding
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

__all__ = ["ELLIPSIS", "Cell", "Column", "FittedTable", "Layout", "chrome_width", "fit_columns", "kv_table"]

Role = Literal["key", "value", "shrink", "text"]
"""How a column may give way: ``key`` never (ids, refs, op names); ``value`` never, but it may be
dropped when optional (numbers, short words); ``shrink`` takes its cells' shorter forms, then an
ellipsis; ``text`` wraps (free text, never cut)."""

ELLIPSIS = "…"
TEXT_MIN = 20  # a text column wraps down to this width before optional columns are dropped
TEXT_FLOOR = 12  # ... and down to this one as a last resort
SHRINK_FLOOR = 5  # a shrinkable column is cut with an ellipsis down to this width, at the last resort


@dataclass(frozen=True)
class Column:
    header: str
    role: Role = "value"
    drop: int | None = None  # optional column: dropped at narrow widths, the lowest first
    justify: Literal["left", "right"] = "left"
    style: str = ""

    def __post_init__(self) -> None:
        if self.role == "key" and self.drop is not None:
            raise ValueError(f"column {self.header!r}: key columns are never dropped")


@dataclass(frozen=True)
class Cell:
    """One cell: its text forms, longest first (only ``shrink`` columns use the shorter ones)."""

    forms: tuple[str, ...]
    style: str = ""

    @classmethod
    def of(cls, value: str | Cell) -> Cell:
        return value if isinstance(value, Cell) else cls((value,))


def _width(text: str) -> int:
    return max((cell_len(line) for line in text.splitlines()), default=0)


def chrome_width(columns: int) -> int:
    """Width a table adds to its columns' content: two cells between neighbouring columns (a
    space of padding either side without a box; padding and the blank separator of
    :data:`rich.box.SIMPLE_HEAD` with one)."""
    return 2 * (columns - 1) if columns else 0


@dataclass(frozen=True)
class Layout:
    shown: list[int]  # indices of the columns shown, in order
    widths: list[int]  # content width of each shown column

    @property
    def cells_width(self) -> int:
        return sum(self.widths)


@dataclass(frozen=True)
class _Measure:
    natural: int  # widest full form (or header)
    short: int  # width it may take before columns are dropped
    floor: int  # width it may take at the last resort
    steps: tuple[int, ...] | None = None  # shrink columns: the widths at which some cell shows a longer form


def _measure(column: Column, cells: list[Cell]) -> _Measure:
    head = cell_len(column.header)
    natural = max([head, *(_width(c.forms[0]) for c in cells)])
    if column.role == "shrink":
        short = max([head, *(_width(c.forms[-1]) for c in cells)])
        steps = tuple(sorted({head, *(_width(f) for c in cells for f in c.forms)}))
        return _Measure(natural, short, min(short, max(head, SHRINK_FLOOR)), steps)
    if column.role == "text":
        return _Measure(natural, min(natural, max(head, TEXT_MIN)), min(natural, max(head, TEXT_FLOOR)))
    return _Measure(natural, natural, natural)


def _proportional(low: list[int], high: list[int], room: int) -> list[int]:
    """``low`` plus ``room`` shared in proportion to what each wants (``high - low``)."""
    wants = [h - lo for lo, h in zip(low, high)]
    if room <= 0 or not any(wants):
        return list(low)
    if room >= sum(wants):
        return list(high)
    extra = [room * w // sum(wants) for w in wants]
    left = room - sum(extra)
    for i in sorted(range(len(wants)), key=lambda i: -wants[i]):
        if left == 0:
            break
        if extra[i] < wants[i]:
            extra[i] += 1
            left -= 1
    return [lo + e for lo, e in zip(low, extra)]


def _allocate(measures: list[_Measure], low: list[int], budget: int) -> list[int]:
    """Widths from ``low`` up to the natural ones within ``budget``: shrinkable columns first, left to
    right, each to the widest step that fits (a width between steps shows nothing more); free
    text shares what is left."""
    widths = list(low)
    room = budget - sum(widths)
    for i, m in enumerate(measures):
        if m.steps is None or room <= 0:
            continue
        best = max((w for w in m.steps if widths[i] < w <= min(m.natural, widths[i] + room)), default=widths[i])
        room -= best - widths[i]
        widths[i] = best
    text = [i for i, m in enumerate(measures) if m.steps is None]
    for i, w in zip(text, _proportional([widths[i] for i in text], [measures[i].natural for i in text], room)):
        widths[i] = w
    return widths


def _importance(column: Column) -> float:
    return math.inf if column.drop is None else column.drop


def _widths(measures: list[_Measure], shown: list[int], width: int) -> list[int]:
    """Widths of the shown columns within ``width``: natural when they fit, else grown from the
    short widths (or the floors, when even those do not fit)."""
    budget = width - chrome_width(len(shown))
    short = [measures[i].short for i in shown]
    low = short if sum(short) <= budget else [measures[i].floor for i in shown]
    return _allocate([measures[i] for i in shown], low, budget)


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[Cell]], width: int, *, wide: bool = False) -> Layout:
    """Which columns to show and how wide, for a table at most ``width`` cells wide (see the module
    docstring for the order of concessions). A shrinkable column that would still show an
    ellipsis is shown without one instead when dropping less important optional columns makes
    room for it (so shapes do not get elided as the terminal gets wider). The result is wider than
    ``width`` only when the key columns and the floors of the others do not fit."""
    measures = [_measure(col, [row[i] for row in rows]) for i, col in enumerate(columns)]
    shown = list(range(len(columns)))
    if wide:
        return Layout(shown, [m.natural for m in measures])
    by_drop = [i for _, i in sorted((c.drop, i) for i, c in enumerate(columns) if c.drop is not None)]
    while sum(measures[i].short for i in shown) + chrome_width(len(shown)) > width and set(by_drop) & set(shown):
        shown.remove(next(i for i in by_drop if i in shown))
    widths = _widths(measures, shown, width)

    def elided(i: int, w: int) -> bool:
        return columns[i].role == "shrink" and any(ELLIPSIS in _form_for(row[i], w) or _width(_form_for(row[i], w)) > w
                                                   for row in rows)

    for i in sorted((i for i, w in zip(shown, widths) if elided(i, w)), key=lambda i: -_importance(columns[i])):
        trial = list(shown)
        for j in (j for j in by_drop if j in shown and _importance(columns[j]) < _importance(columns[i])):
            trial.remove(j)
            trial_widths = _widths(measures, trial, width)
            if not elided(i, trial_widths[trial.index(i)]):
                shown, widths = trial, trial_widths
                break
    return Layout(shown, widths)


def _form_for(cell: Cell, width: int) -> str:
    """The longest form that fits ``width`` (the shortest otherwise: rich then adds the ellipsis)."""
    return next((f for f in cell.forms if _width(f) <= width), cell.forms[-1])


@dataclass
class FittedTable:
    """A table laid out for the width it is rendered at (see the module docstring)."""

    columns: list[Column]
    rows: list[list[Cell]] = field(default_factory=list)
    title: str | None = None
    wide: bool = False
    show_header: bool = True
    stack: bool = False  # when free text would wrap, show each row as a block instead (see _stacked)

    def add_row(self, *cells: str | Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([Cell.of(c) for c in cells])

    def layout(self, width: int) -> Layout:
        return fit_columns(self.columns, self.rows, width, wide=self.wide)

    def width(self, layout: Layout) -> int:
        return layout.cells_width + chrome_width(len(layout.shown))

    def _table(self, layout: Layout, boxed: bool) -> Table:
        boxed = boxed and self.show_header
        table = Table(box=box.SIMPLE_HEAD if boxed else None, padding=(0, 1, 0, 0) if boxed else (0, 1),
                      show_edge=False, pad_edge=False, show_header=self.show_header, header_style="bold", expand=False)
        for i, w in zip(layout.shown, layout.widths):
            col = self.columns[i]
            table.add_column(Text(col.header), width=w, justify=col.justify, style=col.style or None,
                             no_wrap=col.role != "text", overflow="ellipsis" if col.role == "shrink" else "fold")
        for row in self.rows:
            table.add_row(*(Text(_form_for(row[i], w), style=row[i].style) for i, w in zip(layout.shown, layout.widths)))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.title:
            yield Text(self.title, style="bold")
        if not self.rows and self.show_header:
            yield Text("(none)", style="dim")
            return
        layout = self.layout(options.max_width)
        if self.stack and self._wraps(layout):
            for block in self._stacked():
                yield from _stripped_lines(console, block, options)
            return
        table = self._table(layout, console.is_terminal)
        yield from _stripped_lines(console, table, options.update_width(max(self.width(layout), options.max_width)))

    def _wraps(self, layout: Layout) -> bool:
        natural = self.layout_natural()
        return any(self.columns[i].role == "text" and w < natural.widths[i] for i, w in zip(layout.shown, layout.widths))

    def layout_natural(self) -> Layout:
        return fit_columns(self.columns, self.rows, 0, wide=True)

    def _stacked(self) -> Iterator[RenderableType]:
        """Each row as a block: its other cells on one line (keys bare, values after their header),
        then each free-text cell below, indented, after its header. Nothing is cut or dropped."""
        for n, row in enumerate(self.rows):
            if n:
                yield Text()
            head = Text()
            for col, cell in zip(self.columns, row):
                if col.role == "text":
                    continue
                if head:
                    head.append("  ")
                if col.role != "key" and col.header:
                    head.append(f"{col.header} ")
                head.append(cell.forms[0], style=cell.style or col.style)
            yield head
            for col, cell in zip(self.columns, row):
                if col.role == "text":
                    yield Padding(Text(f"{col.header}: " if col.header else "").append(cell.forms[0], style=cell.style),
                                  (0, 0, 0, 2), expand=False)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(self.width(self.layout(0)), self.width(self.layout(options.max_width)))


def _stripped_lines(console: Console, renderable: RenderableType, options: ConsoleOptions) -> RenderResult:
    for line in console.render_lines(renderable, options, pad=False):
        yield from _rstrip(line)
        yield Segment.line()


def _rstrip(line: list[Segment]) -> list[Segment]:
    """The line without the blanks rich pads its last cell with (plain output stays grep-friendly)."""
    line = list(line)
    while line and not line[-1].text.strip() and not (line[-1].style and line[-1].style.bgcolor):
        line.pop()
    if line and not (line[-1].style and line[-1].style.bgcolor):
        last = line[-1]
        line[-1] = Segment(last.text.rstrip(" "), last.style, last.control)
    return line


def kv_table(rows: Iterable[tuple[str, str | Cell]], title: str | None = None) -> FittedTable:
    """A two-column table of labels and values (values wrap, never cut)."""
    table = FittedTable([Column("", "value", style="bold"), Column("", "text")], title=title, show_header=False)
    for label, value in rows:
        table.add_row(label, value)
    return table
