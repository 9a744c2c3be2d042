"""``scrapy fleet top SPIDER``: a live terminal view of the fleet, drawn with rich.

One frame (:func:`render`) shows the frontier's depth by state and pages/min as sparklines of
the ``10s`` series (the last hour, as much as fits), the current rates, block rate and ETA,
every worker with its state and health, the top hosts and the alerts.  :func:`run_top`
redraws it every ``interval`` seconds until Ctrl-C or SIGTERM, which exit cleanly (status 0,
the terminal restored); piped, it prints one flushed frame after another.  While Redis
cannot be read the last frame stays, under an error line.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from scrapy_fleet.frontier import budgets
from scrapy_fleet.monitoring.screen import rate_window
from scrapy_fleet.monitoring.source import DEPTH_SERIES, READ_ERRORS, Points, Source
from scrapy_fleet.recrawl.view import host_cells

BARS = "▁▂▃▄▅▆▇█"
HEALTH_STYLE = {"alive": "green", "stalled": "yellow", "dead": "bold red"}
TOP_SERIES = (*DEPTH_SERIES, "pages_per_min")


def sparkline(values: Sequence[float | None], width: int) -> str:
    """The last *width* values as bar characters scaled from 0 to their maximum; a gap
    (None) is a space.  ``sparkline([0, 5, 10], 3) == "▁▅█"``."""
    values = list(values)[-width:] if width > 0 else []
    known = [v for v in values if v is not None]
    top = max(known, default=0.0)
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif top <= 0:
            out.append(BARS[0])
        else:
            out.append(BARS[min(len(BARS) - 1, int(v / top * (len(BARS) - 1) + 0.5))])
    return "".join(out)


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _pct(value: Any) -> str:
    return "-" if value is None else f"{100 * float(value):.1f} %"


def _eta(seconds: Any) -> str:
    if seconds is None:
        return "-"
    s = float(seconds)
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.0f} min" if s < 7200 else f"{s / 3600:.1f} h"


def _clock(t: Any) -> str:
    return "-" if not t else time.strftime("%H:%M:%S", time.localtime(float(t)))


def adaptive_cells(host: Mapping[str, Any]) -> tuple[str, str, str]:
    """A snapshot host row's adaptive politeness cells (docs/politeness.md): "rate/ceil"
    (requests/s, "-" without a configured rate), "learned" capacity (requests/s, "-": never
    overloaded) and "cut", the last decrease's reason and time ("-": none)."""
    ceiling, rate = host.get("ceiling"), host.get("adaptive_rate")
    pair = "-" if ceiling is None or rate is None else f"{float(rate):g}/{float(ceiling):g}"
    capacity = "-" if host.get("capacity") is None else f"{float(host['capacity']):g}"
    why = host.get("last_decrease")
    cut = "-" if not why else f"{why} {_clock(host.get('last_decrease_at'))}"
    return pair, capacity, cut


def recrawl_line(rv: Mapping[str, Any]) -> Text | None:
    """The recrawl's figures (docs/recrawl.md; the snapshot's ``recrawl`` block): tracked
    URLs, due now and overdue, revisits per minute and the shares of changed 200s, unchanged
    200s and 304s among revisits; None for a crawl without a recrawl."""
    if not (rv.get("tracked") or rv.get("scheduled")):
        return None
    line = Text()
    line.append("recrawl ", style="cyan")
    line.append(f"tracked {_fmt(rv.get('tracked'))}  due now {_fmt(rv.get('due'))}  overdue "
                f"{_fmt(rv.get('overdue'))}  revisits/min {_fmt(rv.get('revisits_per_min'), 1)}"
                f"  changed {_pct(rv.get('changed_share'))}  unchanged 200 "
                f"{_pct(rv.get('unchanged_share'))}  304 {_pct(rv.get('not_modified_share'))}")
    return line


def sessions_line(pools: Mapping[str, Any]) -> Text | None:
    """The session pools (docs/sessions.md; the snapshot's ``sessions`` block): per pool,
    active / drawable sessions, logins, failed checks and retirements by reason; None
    without pools."""
    if not pools:
        return None
    line = Text()
    line.append("sessions ", style="cyan")
    parts = []
    for pool, p in sorted(pools.items()):
        retired = p.get("retired") or {}
        why = ", ".join(f"{k} {v}" for k, v in sorted(retired.items()))
        parts.append(f"{pool} {_fmt(p.get('active'))}/{_fmt(p.get('drawable'))} active  "
                     f"logins {_fmt(p.get('logins'))}  failed checks "
                     f"{_fmt(p.get('check_failed'))}  retired {sum(retired.values())}"
                     + (f" ({why})" if why else ""))
    line.append(";  ".join(parts))
    return line


def recrawl_cells(host: Mapping[str, Any]) -> tuple[str, str, str]:
    """A snapshot host row's recrawl cells: tracked pages, learned change rate (changes a
    day) and price (recrawl/view.py ``host_cells``)."""
    rate, price = host_cells(dict(host))
    return _fmt(host.get("recrawl_pages")), rate, price


def depth_values(series: Mapping[str, Points]) -> list[float | None]:
    """Total depth (due + deferred + leased + parked; dead letters apart) per step."""
    steps: dict[float, float | None] = {}
    for name in DEPTH_SERIES[:-1]:
        for t, v in series.get(name, []):
            if v is not None:
                steps[t] = (steps.get(t) or 0.0) + v
            else:
                steps.setdefault(t, None)
    return [steps[t] for t in sorted(steps)]


def render(snap: Mapping[str, Any], series: Mapping[str, Points], *, width: int = 100,
           error: str | None = None, hosts: int = 10) -> RenderableType:
    """One frame of ``top`` for a snapshot (docs/monitoring.md) and its series."""
    frontier = snap.get("frontier") or {}
    counters = snap.get("counters") or {}
    rates = snap.get("rates") or {}
    workers = [w for w in snap.get("workers") or [] if isinstance(w, Mapping)]
    parts: list[RenderableType] = []

    head = Text()
    head.append(f"scrapy-fleet top · crawl {snap.get('crawl', '?')}", style="bold")
    head.append(f" · {_clock(snap.get('at'))} · workers alive {snap.get('workers_alive', 0)}"
                f" of {len(workers)} · runnable now {_fmt(snap.get('runnable_now'))}")
    parts.append(head)
    if error:
        parts.append(Text(f"Redis cannot be read: {error} (showing the last data)",
                          style="bold white on red"))
    control = snap.get("control")
    if isinstance(control, Mapping):  # crawl control (issue 34): docs/control.md
        from scrapy_fleet.frontier.control import status_line

        parts.append(Text(status_line(dict(control)).strip(),
                          style="bold yellow" if control.get("paused") else ""))

    spark_width = max(10, width - 40)
    figures = Table.grid(padding=(0, 2))
    figures.add_column(style="cyan", no_wrap=True)
    figures.add_column(justify="right", no_wrap=True)
    figures.add_column(no_wrap=True)
    depth = depth_values(series)
    figures.add_row("depth", _fmt(sum(int(frontier.get(s) or 0) for s in
                                      ("due", "deferred", "leased", "parked"))),
                    Text(sparkline(depth, spark_width), style="blue"))
    for state in ("due", "deferred", "leased", "parked", "dead"):
        values = [v for _, v in series.get(f"depth_{state}", [])]
        figures.add_row(f"  {state}", _fmt(frontier.get(state)),
                        Text(sparkline(values, spark_width), style="dim"))
    pages = [v for _, v in series.get("pages_per_min", [])]
    figures.add_row("pages/min", _fmt(rates.get("pages_per_min"), 1),
                    Text(sparkline(pages, spark_width), style="green"))
    figures.add_row("", "", Text(f"rates per minute{rate_window(rates)}; the sparkline: "
                                 "each 10 s step's rate", style="dim"))
    parts.append(figures)
    recrawl = recrawl_line(snap.get("recrawl") or {})
    if recrawl is not None:
        parts.append(recrawl)
    sessions = sessions_line(snap.get("sessions") or {})
    if sessions is not None:
        parts.append(sessions)

    responses = counters.get("responses") or {}
    totals = Text()
    totals.append(f"pages {_fmt(counters.get('pages'))}  "
                  f"items (reported) {_fmt(counters.get('items_scraped'))}"
                  f"  items/min {_fmt(rates.get('items_per_min'), 1)}  block rate "
                  f"{_pct(rates.get('block_rate'))}  ETA {_eta(snap.get('eta_seconds'))}  ")
    totals.append("  ".join(f"{k} {_fmt(responses.get(k))}" for k in
                            ("2xx", "3xx", "4xx", "5xx")), style="dim")
    parts.append(totals)
    budget = budgets.status_line(snap.get("budget") or {})  # issue 34: docs/control.md
    if budget:
        parts.append(Text(f"budget {budget}"))

    table = Table(title="workers", box=box.SIMPLE_HEAD, title_justify="left", expand=False)
    for name, justify in (("worker", "left"), ("state", "left"), ("health", "left"),
                          ("leases", "right"), ("downloads", "right"), ("pages", "right"),
                          ("items", "right"), ("errors", "right"), ("last seen", "right")):
        table.add_column(name, justify=justify, no_wrap=name == "worker")  # type: ignore[arg-type]
    now = float(snap.get("at") or time.time())
    for w in workers:
        seen = w.get("last_seen")
        table.add_row(str(w.get("id", "?")), str(w.get("state", "?")),
                      Text(str(w.get("health", "?")),
                           style=HEALTH_STYLE.get(str(w.get("health")), "")),
                      _fmt(w.get("leases")), _fmt(w.get("downloads")), _fmt(w.get("pages")),
                      _fmt(w.get("items")), _fmt(w.get("errors")),
                      "-" if not seen else f"{max(0.0, now - float(seen)):.0f} s ago")
    if not workers:
        table.add_row("(no worker)", "", "", "", "", "", "", "", "")
    parts.append(table)

    host_rows = [h for h in snap.get("hosts") or [] if isinstance(h, Mapping)][:hosts]
    # the recrawl's columns (tracked pages, change rate, price) when a listed host has any
    recrawled = any(h.get("recrawl_pages") for h in host_rows)
    htable = Table(title="top hosts", box=box.SIMPLE_HEAD, title_justify="left")
    for name in ("host", "queued", "downloading", "pages", "bans", "block rate", "held until",
                 "rate/ceil", "learned", "cut",
                 *(("rv pages", "chg/day", "price") if recrawled else ())):
        htable.add_column(name, justify="left" if name == "host" else "right")
    for h in host_rows:
        htable.add_row(str(h.get("host", "?")), _fmt(h.get("queued")), _fmt(h.get("leased")),
                       _fmt(h.get("pages")), _fmt(h.get("bans")), _pct(h.get("block_rate")),
                       _clock(h.get("hold_until")) if h.get("hold_until") else "-",
                       *adaptive_cells(h), *(recrawl_cells(h) if recrawled else ()))
    if host_rows:
        parts.append(htable)

    alerts = [a for a in snap.get("alerts") or [] if isinstance(a, Mapping)]
    if alerts:
        for a in alerts:
            line = Text()
            severity = str(a.get("severity", "warning"))
            line.append(f"{severity.upper()} ",
                        style="bold red" if severity == "critical" else "bold yellow")
            line.append(f"{a.get('what', a.get('id', ''))}")
            if a.get("where"):
                line.append(f" ({a['where']})")
            if a.get("since"):
                line.append(f", since {_clock(a['since'])}")
            if a.get("next"):
                line.append(" → ")
                line.append(str(a["next"]), style="bold")
            parts.append(line)
    else:
        parts.append(Text("alerts: none", style="green"))
    return Group(*parts)


def read_frame(source: Source) -> tuple[dict[str, Any], dict[str, Points]]:
    """One snapshot and the ``10s`` series that ``top`` draws (raises READ_ERRORS)."""
    snap = source.snapshot()
    return snap, source.series(TOP_SERIES, "10s")


#: columns of a frame printed to something that is not a terminal (``top --once | ...``)
PIPE_WIDTH = 140


def run_top(source: Source, interval: float = 2.0, once: bool = False, hosts: int = 10,
            console: Console | None = None) -> int:
    """Draw frames until Ctrl-C (or one frame with *once*); returns the exit status (0).

    On a terminal the frame is redrawn in place on the alternate screen, which is left (the
    terminal restored) when the view ends.  Anywhere else (a pipe, a file) each frame is
    printed after the previous one and flushed at once, so a reader sees every frame as it
    is drawn and keeps them all whatever ends the view.  KeyboardInterrupt ends it (the
    caller turns SIGTERM into one: actions.py).

    The first read must succeed (the caller pinged Redis); later failures keep the last
    frame on screen under an error line and the view retries every *interval* seconds."""
    if console is None:
        # not on a terminal (a pipe, a log) rich assumes 80 columns, which cuts the worker
        # table's headers and wraps its fields: take PIPE_WIDTH unless COLUMNS says otherwise
        piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
        console = Console(width=PIPE_WIDTH if piped else None)
    snap, series = read_frame(source)
    if once:
        console.print(render(snap, series, width=console.width, hosts=hosts))
        return 0
    try:
        if console.is_terminal:
            live = Live(render(snap, series, width=console.width, hosts=hosts),
                        console=console, auto_refresh=False, screen=True, transient=False)
            with _signals_held():
                live.start(refresh=True)
            try:
                while True:
                    snap, series, error = _next_frame(source, interval, snap, series)
                    frame = render(snap, series, width=console.width, error=error,
                                   hosts=hosts)
                    with _signals_held():
                        live.update(frame, refresh=True)
            finally:
                with _signals_held():
                    live.stop()  # (leaves the alternate screen)
        else:
            # rich's Live prints nothing to a non-terminal until it stops (which a SIGTERM
            # or a broken pipe never lets it do): one printed, flushed frame per interval
            error = None
            while True:
                console.print(render(snap, series, width=console.width, error=error,
                                     hosts=hosts))
                console.file.flush()
                snap, series, error = _next_frame(source, interval, snap, series)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # `top | head`: the reader has gone
        _silence_stdout()
    return 0


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM held while a frame is written to the terminal, delivered after
    it: a KeyboardInterrupt raised in the middle of an escape sequence could leave the
    terminal on the alternate screen (POSIX ``pthread_sigmask``; elsewhere nothing held)."""
    held = {signal.SIGINT, signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _next_frame(source: Source, interval: float, snap: dict[str, Any],
                series: dict[str, Points]) -> tuple[dict[str, Any], dict[str, Points],
                                                    str | None]:
    """After *interval* seconds: the next snapshot and series, or the last ones with the
    read's error."""
    time.sleep(max(0.1, interval))
    try:
        snap, series = read_frame(source)
    except READ_ERRORS as exc:
        return snap, series, f"{type(exc).__name__}: {exc}"
    return snap, series, None


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of a closed pipe does
    not print a BrokenPipeError at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass
