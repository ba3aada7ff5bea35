"""MirrorJob: mirror passes on a schedule (APScheduler 3) and on demand, never two at once."""


from __future__ import annotations

import logging
import numbers
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from ckptfs.errors import ConfigError, cut_long_words, quote_value
from ckptfs.format.models import validate_id
from ckptfs.format.units import (
    FOREIGN_DIGITS,
    MAX_SCHEDULE_SECONDS,
    foreign_digits,
    parse_duration,
    shown_number,
)
from ckptfs.replication.copy import DEFAULT_ATTEMPTS, DEFAULT_WORKERS, StorageLike
from ckptfs.replication.mirror import Mirror
from ckptfs.replication.report import MirrorReport, NoProgress
from ckptfs.store.compactor import DEFAULT_SUPERSEDED_GRACE

logger = logging.getLogger(__name__)

FINAL_ATTEMPTS = 2  # tries per request of the last pass at shutdown



def to_seconds(interval: float | timedelta | str | None) -> float | None:
    """Seconds between mirror passes; a ConfigError naming the mirror interval for anything
    that is not a positive length of time a scheduler can hold.

    Text is a duration as the config file and `--interval` read it (`parse_duration`: '90',
    '30s', '1h30m'), not float()'s: float() took full-width digits ('\uff11\uff10' was 10 s)
    and '1_0', which every other setting refuses. A bool is a mistake, not 1 s. The value is
    named cut short (`quote_value`): a 5,000-character string is no message."""
    if interval is None:
        return None
    value: float | str
    if isinstance(interval, timedelta):
        value = interval.total_seconds()
    elif isinstance(interval, str):
        value = interval
    elif isinstance(interval, numbers.Real) and not isinstance(interval, bool):
        try:
            value = float(interval)
        except OverflowError:  # an int past a float's range
            raise ConfigError(f"mirror interval is too long: at most {MAX_SCHEDULE_SECONDS}s") from None
    else:
        raise ConfigError(f"mirror interval {shown_number(interval)} ({type(interval).__name__}) "
                          f"is not a number of seconds or a duration")
    try:
        return parse_duration(value, limit=MAX_SCHEDULE_SECONDS)
    except ConfigError as exc:
        raise ConfigError(f"mirror interval: {exc}") from None


_DIGITS = re.compile(r"[0-9]+")


def check_cron(text: str) -> None:
    """Refuse what is no crontab expression (a ConfigError naming it cut short, with the reason):
    the one check of `mirror.cron`, `ckptfs mirror --cron` and `MirrorJob(cron=...)`, so each
    says the same about the same mistake."""
    _cron_trigger(text, "UTC")


def _cron_trigger(text: str, timezone: str) -> Any:
    """APScheduler's CronTrigger for `text`, or a ConfigError saying why not.

    Digits are ASCII only: APScheduler's `\\d` and int() take full-width and every other script's
    digits (a full-width 1, U+FF11, as the minute ran at minute 1), the paste accident
    parse_duration refuses too. A number int() will not convert (over 4,300 digits) is "too
    large": APScheduler passed on int()'s own advice, to call sys.set_int_max_str_digits().
    Its other reasons are kept, each long word cut (`cut_long_words`): they repeat the refused
    field, and parts of it, whole."""
    from apscheduler.triggers.cron import CronTrigger

    def refused(reason: str) -> ConfigError:
        return ConfigError(f"{quote_value(text)} is not a cron expression ({reason})")

    if foreign_digits(text):
        raise refused(FOREIGN_DIGITS.removeprefix("; "))
    for number in _DIGITS.findall(text):
        try:
            int(number)
        except ValueError:  # past int()'s conversion limit: no field's value, whatever it is
            raise refused(f"a number of {len(number)} digits is too large") from None
    try:
        trigger = CronTrigger.from_crontab(text, timezone=timezone)
    except ValueError as exc:
        raise refused(cut_long_words(str(exc))) from None
    # A date no calendar holds ('0 0 31 2 *', February 31st) parses, and APScheduler then finds
    # no fire time: `ckptfs mirror --cron` ran one pass and waited forever for the next.
    if trigger.get_next_fire_time(None, datetime.now(trigger.timezone)) is None:
        raise ConfigError(f"cron expression {quote_value(text)} never fires: no date matches "
                          f"all of its fields")
    return trigger


class MirrorJob:
    """Mirror passes on a schedule (APScheduler 3) and on demand, never two at once.

    interval (seconds or timedelta) or cron (a crontab expression) sets the schedule; both
    None means passes run only when triggered. The scheduler job has max_instances=1,
    coalesce=True and `misfire_grace_time`, and every pass also holds one lock, so a tick
    or trigger that arrives while a pass runs is folded into one more pass afterwards.

    `on_report` gets each pass's report; `on_error` each exception a pass raised instead (an end
    that stopped answering mid-job): the next tick tries again, and `last_error` is set until
    a pass completes. `keep_last` and `superseded_grace` are retention on the mirror, as for
    `mirror`.

    The agent calls `notify(run_id, version)` (or the callable from `step_trigger(n)`) after
    each commit: it returns at once, and when the run crossed a multiple of N it schedules a
    pass that mirrors that run's newest version. It never blocks the agent's commits.
    `shutdown()` ends with a last pass of the runs it was notified of, at their newest, as
    Litestream syncs once more when it stops: a run that finished at v57 with every_n=10 was
    left at v50 on the mirror, its last seven steps lost with the machine after a clean exit.
    """

    JOB_ID = "ckptfs-mirror"

    def __init__(self, src_url: StorageLike, dst_url: StorageLike, *, every_n: int = 10,
                 interval: float | timedelta | None = None, cron: str | None = None,
                 keep_last: int | None = None, latest: bool = False,
                 src_options: Mapping[str, Any] | None = None,
                 dst_options: Mapping[str, Any] | None = None, misfire_grace_time: int = 60,
                 workers: int = DEFAULT_WORKERS, attempts: int = DEFAULT_ATTEMPTS,
                 base_delay: float = 0.2, on_report: Callable[[MirrorReport], None] | None = None,
                 timezone: str = "UTC", run_ids: str | Iterable[str] | None = None,
                 on_error: Callable[[Exception], None] | None = None,
                 superseded_grace: float = DEFAULT_SUPERSEDED_GRACE) -> None:
        if every_n < 1:
            raise ConfigError(f"every_n must be >= 1, got {every_n}")
        if interval is not None and cron is not None:
            raise ConfigError("give a mirror interval or a cron expression, not both")
        if isinstance(misfire_grace_time, bool) or not 1 <= misfire_grace_time <= MAX_SCHEDULE_SECONDS:
            raise ConfigError(f"misfire_grace_time must be 1 to {MAX_SCHEDULE_SECONDS} seconds, "
                              f"got {misfire_grace_time!r}")
        # only these runs, on schedule and on notify (`ckptfs mirror --run X --interval ...`)
        self.run_ids: list[str] | None = (None if run_ids is None else [run_ids] if isinstance(run_ids, str)
                                          else sorted(set(run_ids)))
        self.every_n = every_n
        self.interval = to_seconds(interval)
        self.cron = cron
        self.keep_last = keep_last
        self.latest = latest
        self.on_report = on_report
        self.on_error = on_error  # a pass that raised (the mirror unreachable): no report to give
        self.misfire_grace_time = misfire_grace_time
        self._trigger: Any = None
        if cron is not None:
            self._trigger = _cron_trigger(cron, timezone)
        elif self.interval is not None:
            from apscheduler.triggers.interval import IntervalTrigger

            self._trigger = IntervalTrigger(seconds=self.interval, timezone=timezone)
        self._timezone = timezone
        self._m = Mirror(src_url, dst_url, src_options=src_options, dst_options=dst_options,
                          workers=workers, attempts=attempts, base_delay=base_delay,
                          superseded_grace=superseded_grace)
        self._pass_lock = threading.Lock()
        self._state = threading.Lock()
        self._tick_pending = False
        self._runs_pending: set[str] = set()
        self._seen: dict[str, int] = {}
        # runs notify/step_trigger told of: the last pass at shutdown takes each to its newest
        # version (one that holds it already says up-to-date, at a listing and a compare)
        self._notified: set[str] = set()
        self._scheduler: Any = None
        self._wake = threading.Event()
        self._closing = False
        self._worker: threading.Thread | None = None
        self.passes = 0
        self.overlaps = 0  # ticks/triggers that found a pass running and were folded into it
        self.last_report: MirrorReport | None = None
        self.errors = 0
        self.last_error: Exception | None = None  # the last pass's, None once a pass completes

    # -- lifecycle
    def start(self) -> MirrorJob:
        from apscheduler.schedulers.background import BackgroundScheduler

        self._m.check()
        self._scheduler = BackgroundScheduler(
            timezone=self._timezone,
            job_defaults={"max_instances": 1, "coalesce": True,
                          "misfire_grace_time": self.misfire_grace_time})
        if self._trigger is not None:
            self._scheduler.add_job(self.tick, self._trigger, id=self.JOB_ID, name="ckptfs mirror")
        self._scheduler.start()
        self._closing = False
        self._worker = threading.Thread(target=self._worker_loop, name="ckptfs-mirror-job",
                                        daemon=True)
        self._worker.start()
        with self._state:
            pending = bool(self._runs_pending)
        if pending:
            self._schedule_now()
        return self

    def shutdown(self, wait: bool = True, *, final: bool = True) -> None:
        """Stop scheduling; with `wait`, let a running pass finish (it is never torn anyway),
        then, with `final` too, mirror in one last pass, here, each run it was notified of at
        its newest version. That pass makes at most FINAL_ATTEMPTS tries per request (an
        endpoint holding each request 10 s, then dropping it, held an exit 124 s; now 40 s),
        whatever the passes before it
        met: skipped after one that failed, a run was left with nothing on a mirror that had
        come back. A job never started makes none. `final=False` stops without it."""
        self._closing = True
        self._wake.set()
        started = self._worker is not None
        if self._worker is not None:
            if wait:
                self._worker.join()
            self._worker = None
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=wait)
            self._scheduler = None
        if started and wait and final:
            with self._state:
                notified = sorted(self._notified)
            if notified:
                logger.info("mirror job stopping: a last pass for %d run(s)", len(notified))
                with self._pass_lock, self._m.few_attempts(FINAL_ATTEMPTS):
                    self._one_pass(False, notified)
        self._m.close()

    def __enter__(self) -> MirrorJob:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def src_display(self) -> str:
        return self._m.src.display_url

    @property
    def dst_display(self) -> str:
        return self._m.dst.display_url

    @property
    def scheduler(self) -> Any:
        """The APScheduler BackgroundScheduler (None before start), for pause/resume/inspection."""
        return self._scheduler

    # -- triggers
    def tick(self) -> MirrorReport | None:
        """One scheduled pass over every run (the every_n rule); folded if one is running."""
        with self._state:
            self._tick_pending = True
        return self._drain()

    def notify(self, run_id: str, version: int) -> bool:
        """Tell the job a run committed `version`; True if that crossed a multiple of every_n.
        A run id that is no valid id raises InvalidIdError here."""
        validate_id(run_id, "run id")  # here, not in a pass: one bad id failed every pass after
        if not self._mirrors(run_id):
            return False
        with self._state:
            last = self._seen.get(run_id, 0)
            self._seen[run_id] = max(last, version)
            self._notified.add(run_id)
            crossed = version // self.every_n > last // self.every_n
            if crossed:
                self._runs_pending.add(run_id)
        if crossed:
            self._schedule_now()
        return crossed

    def step_trigger(self, every_n: int | None = None) -> Callable[[str, int], bool]:
        """A callable for the agent's checkpoint path: (run_id, version) -> scheduled?"""
        n = every_n or self.every_n
        if n < 1:
            raise ConfigError(f"every_n must be >= 1, got {n}")
        seen: dict[str, int] = {}
        lock = threading.Lock()

        def trigger(run_id: str, version: int) -> bool:
            validate_id(run_id, "run id")
            if not self._mirrors(run_id):
                return False
            with self._state:
                self._notified.add(run_id)
            with lock:
                last = seen.get(run_id, 0)
                seen[run_id] = max(last, version)
                if version // n <= last // n:
                    return False
            with self._state:
                self._runs_pending.add(run_id)
            self._schedule_now()
            return True

        return trigger

    def _mirrors(self, run_id: str) -> bool:
        return self.run_ids is None or run_id in self.run_ids

    def _schedule_now(self) -> None:
        """Wake the job's own worker; never touches the scheduler's locks (no deadlock at exit)."""
        self._wake.set()

    def _worker_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            try:
                self._drain()
            except Exception:  # _one_pass logs; keep the worker alive
                logger.exception("mirror worker")

    def run_now(self) -> MirrorReport | None:
        """A pass right here, in the caller's thread (None if one is running: it is folded)."""
        return self.tick()

    # -- the pass
    def _drain(self) -> MirrorReport | None:
        """One pass over what is pending; work that arrives meanwhile gets a pass of its own.

        Callers record their work before trying the lock, and the holder looks for new work
        only after releasing it, so a trigger is never lost between the two; one pass per
        call keeps every thread (the caller's, the scheduler's) from being held in a loop.
        """
        if not self._pass_lock.acquire(blocking=False):
            with self._state:
                self.overlaps += 1
            return None
        report: MirrorReport | None = None
        try:
            with self._state:
                tick, runs = self._tick_pending, sorted(self._runs_pending)
                self._tick_pending = False
                self._runs_pending.clear()
            if tick or runs:
                report = self._one_pass(tick, runs)
        finally:
            self._pass_lock.release()
        with self._state:
            more = self._tick_pending or bool(self._runs_pending)
        if more and not self._closing:
            self._schedule_now()
        return report

    def _one_pass(self, tick: bool, runs: list[str]) -> MirrorReport | None:
        try:
            report: MirrorReport | None = None
            if runs:
                report = self._m.pass_(runs, self.every_n, True, self.keep_last, NoProgress())
            if tick:
                full = self._m.pass_(self.run_ids, self.every_n, self.latest, self.keep_last,
                                     NoProgress())
                if report is not None:
                    done = {r.run_id for r in report.runs}
                    full.runs = report.runs + [r for r in full.runs if r.run_id not in done]
                    full.seconds += report.seconds
                    full.retries += report.retries
                report = full
        except Exception as exc:
            self.errors += 1
            self.last_error = exc
            logger.exception("mirror pass failed; %s", "not tried again: the job is stopping"
                             if self._closing else "the next tick tries again")
            if self.on_error is not None:
                self.on_error(exc)
            return None
        self.passes += 1
        self.last_report = report
        self.last_error = None
        if report is not None:
            if not report.ok:
                logger.warning("mirror pass incomplete: %s", "; ".join(report.missing[:3]))
            if self.on_report is not None:
                self.on_report(report)
        return report

