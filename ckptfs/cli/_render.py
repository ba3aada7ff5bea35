"""Tables that stay readable at 80 columns: ids never wrap, long text is cut with an ellipsis,
and when even that does not fit, the least useful columns go (`--json` has every field).

Rich's own fitting wraps every column a little, which put a run id over three lines and a goal
over eleven in an 80-column terminal. Here each column is declared with a priority: identifiers
and statuses are required and never wrap (`no_wrap=True`); one text column flexes (`overflow=
"ellipsis"`) into what is left; optional columns are dropped, lowest priority first, until the
required ones plus the flexible column's minimum fit.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

_GAP = 3  # SIMPLE_HEAD without edges: one pad, one space, one pad between columns
# C0 and C1 controls but tab and newline: ESC, CSI (0x9b) and the rest start terminal sequences.
# Also the characters that reorder or break what a terminal shows without being controls: the
# line and paragraph separators (a row split in two), the bidi marks, embeddings, overrides and
# isolates (U+202E turns the rest of a row around: a thread id or a goal could spoof its
# neighbours, as Trojan Source does in code).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _spelled(m: re.Match[str]) -> str:
    cp = ord(m.group())
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}"


def printable(text: str) -> str:
    """Stored text as it can go to a terminal: control characters spelled out (`\\x1b`), not
    sent. A goal, a title, a result is data, often an LLM's reply: an escape sequence in it
    retitled the window or cleared the screen of whoever ran `ckptfs show`. `--json` keeps it whole."""
    return _CONTROL.sub(_spelled, text)


@dataclass(frozen=True)
class Col:
    """A column: `priority` None = always shown; higher numbers are kept longer. `flex` marks
    the one text column that takes the remaining width and is cut with an ellipsis."""

    header: str
    priority: int | None = None
    flex: bool = False
    justify: str = "left"
    min_width: int = 10
    style: str | None = None


def _width(cell: Any) -> int:
    from rich.text import Text

    if isinstance(cell, Text):
        return max((len(line) for line in cell.plain.splitlines()), default=0)
    return max((len(line) for line in str(cell).splitlines()), default=0)


def fit_table(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[RenderableType]],
              title: str | None = None) -> tuple[Table, list[str]]:
    """A table of `rows` fitted to the console's width, and the headers of dropped columns."""
    from rich import box
    from rich.table import Table

    natural = [max([len(c.header), *(_width(r[i]) for r in rows)]) for i, c in enumerate(cols)]
    shown = list(range(len(cols)))

    def need(idx: list[int]) -> int:
        fixed = sum(natural[i] if not cols[i].flex else min(natural[i], cols[i].min_width) for i in idx)
        return fixed + _GAP * (len(idx) - 1)

    optional = sorted((i for i, c in enumerate(cols) if c.priority is not None),
                      key=lambda i: cols[i].priority or 0)
    dropped: list[str] = []
    while need(shown) > console.width and optional:
        victim = optional.pop(0)
        shown.remove(victim)
        dropped.append(cols[victim].header)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  header_style="bold", title_justify="left", title_style="bold")
    fixed = sum(natural[i] for i in shown if not cols[i].flex) + _GAP * (len(shown) - 1)
    for i in shown:
        c = cols[i]
        if c.flex:
            room = max(c.min_width, console.width - fixed)
            table.add_column(c.header, no_wrap=True, overflow="ellipsis", justify=c.justify,  # type: ignore[arg-type]
                             max_width=room, style=c.style)
        else:
            table.add_column(c.header, no_wrap=True, overflow="ellipsis", justify=c.justify,  # type: ignore[arg-type]
                             min_width=natural[i], style=c.style)
    for r in rows:
        table.add_row(*(_one_line(r[i]) for i in shown))
    return table, dropped


def _one_line(cell: RenderableType) -> RenderableType:
    """A cell on one line; text as it is, never read as markup: cells are data (thread ids, goals,
    keys), and '[/x]' in one was a closing tag to rich (MarkupError: the whole table failed)."""
    from rich.text import Text

    if isinstance(cell, Text):
        return cell
    return Text(printable(str(cell).replace("\n", " ")))


def print_table(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[RenderableType]],
                title: str | None = None) -> None:
    """Print a fitted table; name the columns left out, so nobody wonders where they went."""
    table, dropped = fit_table(console, cols, rows)
    if title:  # its own line(s): a table's own title wraps at the table's width, not the screen's
        from rich.text import Text

        console.print(Text(printable(title), style="bold"))  # it names a thread, a run, a URL
    console.print(table)
    if dropped:
        console.print(f"[dim](narrow terminal: {', '.join(dropped)} not shown; --json has every field)[/dim]")


def fit_line(console: Console, text: str, bold: int = 0) -> None:
    """One line cut with an ellipsis at the console's width (a header naming a long goal);
    the first `bold` characters bold. The whole text is in --json."""
    from rich.text import Text

    line = Text(printable(" ".join(text.split())), no_wrap=True, overflow="ellipsis")
    if bold:
        line.stylize("bold", 0, bold)
    console.print(line, no_wrap=True, overflow="ellipsis", crop=True)


def clip(text: str, width: int = 60) -> str:
    """A user-given name shortened for a table or a message: LangGraph thread ids have no length
    limit, and one of thousands of characters would push every other column off the screen
    (`--json` keeps it whole)."""
    return text if len(text) <= width else f"{text[:width]}… ({len(text):,} characters)"


def timestamp(t: float | None) -> str:
    """Local time, to the second; '-' for unknown. A time no calendar holds (a caller's
    started_at of -1e300, a header's time of 1e300: both load) is shown as the number."""
    if not t:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    except (OverflowError, OSError, ValueError):
        return repr(t)


def age(t: float | None, now: float | None = None) -> str:
    """'12s ago', '5m ago', '3h ago', '2d ago': short enough for a narrow column."""
    if not t:
        return "-"
    s = max(0.0, (time.time() if now is None else now) - t)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{s / size:.0f}{unit} ago"
    return f"{s:.0f}s ago"


# Past this, a figure in a table or a summary line is shown as 1.23e+45: stored values may be
# any finite float or any int a commit takes (4,300 digits), and written out in full one was a
# screen of digits (show's summary printed 5,700 characters for one token count). --json keeps
# every value exact.
_FULL_UP_TO = 10**15


def _scientific(v: int) -> str:
    """An int of any size as 1.23e+45, without converting it to a float (past 1e308 it cannot)."""
    sign, v = ("-", -v) if v < 0 else ("", v)
    exp = len(str(v)) - 1 if v < 10**4000 else math.floor(math.log10(v))
    if exp > 0 and v < 10**exp:  # log10 rounded up to the next power of ten (v = 10**k - 1)
        exp -= 1
    elif v >= 10 ** (exp + 1):  # or down, below one
        exp += 1
    lead = v // 10 ** max(exp - 2, 0)  # three leading digits, floored: never overstated
    return f"{sign}{lead // 100}.{lead % 100:02d}e+{exp}"


def money(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= _FULL_UP_TO:
        return f"${v:.2e}" if isinstance(v, float) else f"${_scientific(int(v))}"
    return f"${v:.4f}" if v < 1 else f"${v:,.2f}"


def count(v: int | None) -> str:
    if v is None:
        return "-"
    return _scientific(v) if abs(v) >= _FULL_UP_TO else f"{v:,}"


def seconds(ms: float) -> str:
    """A duration in milliseconds as seconds, e.g. 12.3s; huge ones (a sum of absurd stored
    durations) as 1.23e+300s, never an OverflowError from dividing an int no float holds."""
    if abs(ms) >= _FULL_UP_TO * 1000:
        return f"{ms / 1000:.2e}s" if isinstance(ms, float) else f"{_scientific(int(ms) // 1000)}s"
    return f"{ms / 1000:.1f}s"


def version_list(versions: Sequence[int], head: int = 5) -> str:
    """'v1, v2, v3' in full up to head + 1 of them; beyond that the first `head`, '...' and the
    newest. Eliding one would save nothing, and the newest is the one a restore usually
    wants: a list must never lose it (with exactly head + 1 it once did, without a '...')."""
    shown = sorted(versions)
    if not shown:
        return "none"
    if len(shown) <= head + 1:
        return ", ".join(f"v{v}" for v in shown)
    return ", ".join(f"v{v}" for v in shown[:head]) + f" ... v{shown[-1]}"
