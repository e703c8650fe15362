"""The CLI's table layout (pure logic) and value formats: ids never cut, shorter forms before
dropped columns, drop order, ``--wide``, boxes only on a terminal."""

from __future__ import annotations

import io
import re

import pytest
from rich.cells import cell_len
from rich.console import Console

from modulelens.cli.formats import dtype_short, dtypes_cell, elided, seconds, shape, shapes_cell
from modulelens.cli.tables import Cell, Column, FittedTable, chrome_width, fit_columns, kv_table

CARD_COLUMNS = [
    Column("card", "key"),
    Column("op", "key"),
    Column("kind", "value", drop=2),
    Column("shapes", "shrink", drop=4),
    Column("dtypes", "shrink", drop=1),
    Column("calls", "value", drop=0),
    Column("time/run", "value", drop=3),
    Column("share", "value", drop=5),
]
CARDS = [
    ("demo-block:v1/3", "aten.addmm.default", "compute", [[256], [256, 64], [64, 256]], ["float32"] * 3, "1"),
    ("demo-block:v1/7", "aten.native_layer_norm.default", "memory", [[8, 32, 64], [64], [64]], ["float32"] * 3, "2"),
    ("demo-block:v1/12", "aten._safe_softmax.default", "memory", [[8, 4, 32, 32]], ["bfloat16"], "1"),
    ("demo-block:v1/25", "aten.where.self", "memory", [[32, 32], [], []], ["bool", "float32", "float32"], "1"),
]


def _card_table(wide: bool = False) -> FittedTable:
    table = FittedTable(list(CARD_COLUMNS), title="operator cards demo-block:v1", wide=wide)
    for card_id, op, kind, shapes, dtypes, calls in CARDS:
        table.add_row(card_id, op, kind, shapes_cell(shapes), dtypes_cell(dtypes), calls, "182.71 us", "2.4%")
    return table


def _render(renderable, width: int, terminal: bool = False) -> str:
    out = io.StringIO()
    Console(file=out, width=width, force_terminal=terminal, color_system="standard" if terminal else None,
            legacy_windows=False).print(renderable, crop=False)
    return out.getvalue()


def _plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# --------------------------------------------------------------------------------------------
# Formats
# --------------------------------------------------------------------------------------------


def test_shapes_have_no_spaces_and_lists_elide():
    assert shape([16, 64, 128]) == "[16,64,128]" and shape([]) == "[]" and shape(None) == "-"
    assert elided(["[8,32,64]", "[64]", "[64]"]) == ("[8,32,64] [64] [64]", "[8,32,64] [64] …", "[8,32,64] …")
    assert elided([]) == ("-",)
    assert shapes_cell([[8, 4, 32, 32]]).forms == ("[8,4,32,32]",)


def test_dtypes_shorten_and_deduplicate():
    assert [dtype_short(d) for d in ("float32", "bfloat16", "int64", "uint8", "complex64", "bool", "torch.float16")] == [
        "f32", "bf16", "i64", "u8", "c64", "bool", "f16"]
    assert dtypes_cell(["bool", "float32", "float32"]).forms == ("bool,float32", "bool,f32")
    assert seconds(182.71e-6) == "182.71 us" and seconds(0.0123) == "12.300 ms" and seconds(None) == "-"


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------


def _layout(width: int, wide: bool = False):
    table = _card_table(wide)
    return fit_columns(table.columns, table.rows, width, wide=wide)


@pytest.mark.parametrize("width", range(20, 161, 7))
def test_keys_are_never_narrowed_or_dropped(width):
    layout = _layout(width)
    natural = _layout(width, wide=True).widths
    assert {0, 1} <= set(layout.shown)
    for i, w in zip(layout.shown, layout.widths):
        if CARD_COLUMNS[i].role in ("key", "value"):
            assert w == natural[i], (width, CARD_COLUMNS[i].header)
    keys = natural[0] + natural[1] + chrome_width(2)
    if width >= keys:
        assert layout.cells_width + chrome_width(len(layout.shown)) <= width


def test_shorter_forms_before_dropped_columns_and_drop_order():
    natural = _layout(0, wide=True)
    full = natural.cells_width + chrome_width(len(natural.shown))
    assert _layout(full).widths == natural.widths  # everything fits: nothing changes
    shortened = _layout(full - 4)  # 'bool,float32' -> 'bool,f32' saves enough: nothing dropped
    assert shortened.shown == natural.shown
    assert shortened.widths[4] == len("bool,f32") < natural.widths[4]
    at_80 = _layout(80)
    shown = [CARD_COLUMNS[i].header for i in at_80.shown]
    assert shown[:2] == ["card", "op"] and "share" in shown and "calls" not in shown
    # Dropped in drop order: anything still shown is more important than anything dropped.
    dropped = [c.drop for i, c in enumerate(CARD_COLUMNS) if i not in at_80.shown]
    kept = [c.drop for i, c in enumerate(CARD_COLUMNS) if i in at_80.shown and c.drop is not None]
    assert max(dropped) < min(kept)


def test_an_important_elided_column_is_shown_whole_by_dropping_lesser_ones():
    natural = _layout(0, wide=True).widths
    for width in range(80, 140):
        layout = _layout(width)
        if 3 in layout.shown:
            assert layout.widths[layout.shown.index(3)] == natural[3], width  # shapes whole, never "[256] …"


def test_wide_shows_every_column_in_full():
    layout = _layout(40, wide=True)
    assert layout.shown == list(range(len(CARD_COLUMNS)))
    text = _render(_card_table(wide=True), 40)
    for card_id, op, *_ in CARDS:
        assert card_id in text and op in text
    assert "[256] [256,64] [64,256]" in text and "bool,float32" in text and "calls" in text


def test_a_key_column_rejects_drop():
    with pytest.raises(ValueError, match="never dropped"):
        Column("card", "key", drop=1)


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [40, 60, 80, 100, 132])
def test_rendered_rows_keep_ids_whole_one_row_per_line(width):
    text = _render(_card_table(), width)
    lines = text.splitlines()
    assert lines[0] == "operator cards demo-block:v1"
    for card_id, op, *_ in CARDS:
        row = [line for line in lines if re.search(rf"(^|\s){re.escape(card_id)}\s", line)]
        assert len(row) == 1 and re.search(rf"\s{re.escape(op)}(\s|$)", row[0]), (width, card_id, text)
    keys = max(len(c[0]) for c in CARDS) + max(len(c[1]) for c in CARDS) + 2
    assert all(cell_len(line) <= max(width, keys) for line in lines)
    assert all(line == line.rstrip() for line in lines)  # no padding at the ends of lines
    assert not re.search("[─━│┃╭╰]", text)  # no boxes off a terminal


def test_terminal_gets_a_header_rule_and_colour_with_the_same_widths():
    plain = _render(_card_table(), 100)
    term = _render(_card_table(), 100, terminal=True)
    assert "─" in term and "\x1b[" in term
    assert [cell_len(line) for line in _plain(term).splitlines() if "─" not in line] == [
        cell_len(line) for line in plain.splitlines()]


def test_chrome_width_matches_rich():
    table = FittedTable([Column("a", "key"), Column("b", "key"), Column("c", "key")])
    table.add_row("xxxx", "yyyyyy", "zz")
    line = _render(table, 80).splitlines()[1]
    assert cell_len(line) == 4 + 6 + 2 + chrome_width(3)


def test_text_wraps_and_stacked_rows_keep_keys_whole():
    table = FittedTable([Column("kind", "key"), Column("module", "key"), Column("step", "value"),
                         Column("message", "text")], title="findings", stack=True)
    table.add_row("exploding_activation", "blocks.1.fc", "25", "grows " * 30)
    narrow = _render(table, 60)
    assert narrow.splitlines()[1] == "exploding_activation  blocks.1.fc  step 25"
    assert narrow.splitlines()[2].startswith("  message: grows")
    assert all(cell_len(line) <= 60 for line in narrow.splitlines())
    wide = _render(table, 300)  # room for everything: a table with one row per line
    assert len(wide.splitlines()) == 3 and wide.splitlines()[1].startswith("kind")


def test_kv_table_wraps_values_and_empty_tables_say_so():
    text = _render(kv_table([("ref", "demo-block:v1"), ("path", "/a/b " * 30)], title="t"), 50)
    assert text.splitlines()[:2] == ["t", "ref   demo-block:v1"]
    assert all(cell_len(line) <= 50 for line in text.splitlines())
    empty = FittedTable([Column("ref", "key")], title="captures")
    assert _render(empty, 80).splitlines() == ["captures", "(none)"]
    assert Cell.of("x") == Cell(("x",))
