"""When the agent runtime checkpoints and how it retries: two small frozen policies.

Kept apart from the executor so that a policy can be built from configuration, printed,
compared and tested without running anything. `CheckpointPolicy` says which finished
steps force a commit; `RetryPolicy` says whether a failed attempt is tried again and after
how long (exponential backoff with jitter, or the `retry_after` a rate-limit error carries).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

from ckptfs.format.models import Step
from ckptfs.format.units import MAX_SCHEDULE_SECONDS, require_number, shown_number
from ckptfs.format.units import require_whole as require_whole  # agent.py imports it from here

Granularity = Literal["tool_call", "step", "every_n", "milestone"]
_GRANULARITIES = ("tool_call", "step", "every_n", "milestone")


def _keep(policy: object, name: str, value: object) -> None:
    """Set a frozen policy's field to its checked value when that is another object (a
    numpy.int64 made an int): the policy then holds what `random.Random` and `time.sleep`
    take, as the check promised."""
    if getattr(policy, name) is not value:
        object.__setattr__(policy, name, value)


def _require_exceptions(name: str, value: object) -> None:
    """TypeError unless `value` is an exception class or a tuple of them (what isinstance
    takes): anything else raised TypeError from `is_retryable` at the first failure, out of
    execute_run, with the run left "running" and the policy not named."""
    items = value if isinstance(value, tuple) else (value,)
    for i, t in enumerate(items):
        if not (isinstance(t, type) and issubclass(t, BaseException)):
            # the item, not the tuple: repr of a tuple holding 10**5000 raises ValueError
            got = f"; {name}[{i}] is {shown_number(t)}" if items is value else f", got {shown_number(t)}"
            raise TypeError(f"RetryPolicy: {name} must be a tuple of exception classes{got}")


@dataclass(frozen=True)
class CheckpointPolicy:
    """Which moments make the run's state durable.

    granularity:
        "tool_call": the running step (its attempt count, anything the executor put in its
            metadata) and every finished step are committed after each tool call and when
            each attempt starts; never redo more than one tool call.
        "step" (default): one commit per finished step.
        "every_n": one commit per `every_n` finished steps.
        "milestone": one commit when a step with `milestone=True` finishes.
    durable_attempts: also commit the RUNNING mark when each attempt starts, so that a step
        that kills its process (OOM) is counted and `RetryPolicy.max_total_attempts` can stop
        a crash loop. Off by default: it doubles the commits of a tool-less step.

    Whatever the granularity, tool results are durable before they are returned (that is
    what makes replay safe), failures and the end of a run are always committed, and a tool
    can ask for an immediate checkpoint (`IdempotentToolRunner.run(..., checkpoint=True)`).
    """

    granularity: Granularity = "step"
    every_n: int = 1
    durable_attempts: bool = False

    def __post_init__(self) -> None:
        if self.granularity not in _GRANULARITIES:
            raise ValueError(f"CheckpointPolicy: granularity must be one of {_GRANULARITIES}, "
                             f"got {shown_number(self.granularity)}")
        _keep(self, "every_n", require_whole("CheckpointPolicy", "every_n", self.every_n, 1))
        if not isinstance(self.durable_attempts, bool):  # "no" would be true
            raise TypeError(f"CheckpointPolicy: durable_attempts must be True or False, "
                            f"got {shown_number(self.durable_attempts)}")

    @classmethod
    def every_tool_call(cls) -> CheckpointPolicy:
        return cls("tool_call", 1, durable_attempts=True)

    @classmethod
    def every_step(cls) -> CheckpointPolicy:
        return cls("step")

    @classmethod
    def every_n_steps(cls, n: int) -> CheckpointPolicy:
        return cls("every_n", n)

    @classmethod
    def at_milestones(cls) -> CheckpointPolicy:
        return cls("milestone")

    @property
    def commits_attempt_start(self) -> bool:
        return self.durable_attempts or self.granularity == "tool_call"

    def due_after_step(self, step: Step, finished_since_commit: int) -> bool:
        """Whether finishing `step` (the n-th finished since the last commit) needs a commit."""
        g = self.granularity
        if g in ("step", "tool_call"):
            return True
        if g == "every_n":
            return finished_since_commit >= self.every_n
        return step.milestone

    def describe(self) -> str:
        if self.granularity == "every_n":
            return f"every {self.every_n} steps"
        return {"tool_call": "every tool call", "step": "every step",
                "milestone": "at milestones"}[self.granularity]


def retry_after_of(exc: BaseException) -> float | None:
    """The delay an error asks for (a 429's Retry-After), in seconds, if it carries one."""
    try:
        value = getattr(exc, "retry_after", None)
    except Exception:  # a property that cannot read its header: no delay asked, the backoff
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and value > 10**18:  # past a float (10**400 raised OverflowError)
        return math.inf
    if not math.isfinite(value) or value < 0:
        return None
    return float(value)


# Errors that say the code is wrong, not the world: the same inputs fail the same way on every
# attempt, so backing off only delays the report (a NameError retried like a 429 took 1,187 log
# lines to reach RetriesExhaustedError). KeyError, IndexError and ValueError are left out on
# purpose: code that reads an upstream reply (`reply["choices"]`) raises them when a rate-limited
# or half-broken service answers with an error payload, and that is worth another try.
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (
    NameError,  # UnboundLocalError too
    TypeError,
    AttributeError,
    AssertionError,
    ImportError,  # ModuleNotFoundError too
    SyntaxError,  # IndentationError too
    ZeroDivisionError,
    NotImplementedError,
    RecursionError,
)


@dataclass(frozen=True)
class RetryPolicy:
    """Whether and when a failed step attempt is tried again.

    max_attempts: attempts per step within one `execute_run` (a new process gets a fresh
        budget: the rate limit that stopped yesterday's run has usually gone by now).
    base_delay, multiplier, max_delay: exponential backoff, `base * multiplier**(n-1)`
        capped at `max_delay`, for the n-th failed attempt.
    jitter: fraction of the delay drawn at random and taken off (0.25: between 75% and
        100% of it), so that many agents rate-limited together do not retry together.
    max_retry_after: the longest `retry_after` honoured as given; longer requests are capped.
    retry_on: which exceptions are retried (default: any Exception) ...
    never_retry: ... except these, which fail the step at once. Default `PROGRAMMING_ERRORS`
        (NameError, TypeError, AttributeError, AssertionError, ImportError, SyntaxError,
        ZeroDivisionError, NotImplementedError, RecursionError): a bug fails the same way every
        time. `never_retry=()` retries them like anything else.
    give_up_on: more exceptions that fail at once (your own permanent errors), on top of
        never_retry; anything not in retry_on fails at once too.
    on_exhausted: "stop" ends the run with `RetriesExhaustedError`, the step left PENDING
        and the checkpoint intact so that the next process resumes there; "fail" marks the
        step FAILED, skips its dependants and carries on with the rest of the graph.
    max_total_attempts: a lifetime cap on `Step.attempt_count` across processes; reaching it
        fails the step (meaningful with `CheckpointPolicy.durable_attempts`).
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    multiplier: float = 2.0
    max_delay: float = 30.0
    jitter: float = 0.25
    max_retry_after: float = 600.0
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    give_up_on: tuple[type[BaseException], ...] = ()
    on_exhausted: Literal["stop", "fail"] = "stop"
    max_total_attempts: int | None = None
    seed: int | None = field(default=None, compare=False)
    never_retry: tuple[type[BaseException], ...] = PROGRAMMING_ERRORS  # last: positional order kept

    def __post_init__(self) -> None:
        _keep(self, "max_attempts", require_whole("RetryPolicy", "max_attempts", self.max_attempts, 1))
        for name in ("base_delay", "max_delay", "max_retry_after"):  # seconds, slept as given:
            # time.sleep refuses a delay too long for its clock; a schedule's bound is far enough
            _keep(self, name, require_number("RetryPolicy", name, getattr(self, name), 0.0,
                                             MAX_SCHEDULE_SECONDS, " seconds (100 years)"))
        _keep(self, "multiplier", require_number("RetryPolicy", "multiplier", self.multiplier, 1.0))
        _keep(self, "jitter", require_number("RetryPolicy", "jitter", self.jitter, 0.0, 1.0))
        if self.on_exhausted not in ("stop", "fail"):
            raise ValueError(f"RetryPolicy: on_exhausted must be 'stop' or 'fail', "
                             f"got {shown_number(self.on_exhausted)}")
        if self.max_total_attempts is not None:
            _keep(self, "max_total_attempts",
                  require_whole("RetryPolicy", "max_total_attempts", self.max_total_attempts, 1))
        if self.seed is not None:  # random.Random takes an int, not a numpy.int64
            _keep(self, "seed", require_whole("RetryPolicy", "seed", self.seed))
        for name in ("retry_on", "give_up_on", "never_retry"):
            _require_exceptions(name, getattr(self, name))

    @classmethod
    def never(cls) -> RetryPolicy:
        return cls(max_attempts=1)

    def is_retryable(self, exc: BaseException) -> bool:
        """Whether a failed attempt that raised `exc` is worth another one."""
        return (isinstance(exc, self.retry_on) and not isinstance(exc, self.give_up_on)
                and not isinstance(exc, self.never_retry))

    def why_not_retried(self, exc: BaseException) -> str:
        """Why `exc` fails the step at once, for the log line (empty if it is retryable)."""
        if self.is_retryable(exc):
            return ""
        if isinstance(exc, self.never_retry) and isinstance(exc, self.retry_on) \
                and not isinstance(exc, self.give_up_on):
            return (f"{type(exc).__name__} is a programming error (RetryPolicy.never_retry): "
                    "retrying cannot help")
        if isinstance(exc, self.give_up_on):
            return f"{type(exc).__name__} is in RetryPolicy.give_up_on"
        return f"{type(exc).__name__} is not in RetryPolicy.retry_on"

    def delay(self, failed_attempts: int, exc: BaseException | None = None,
              rng: random.Random | None = None) -> float:
        """Seconds to wait before the next attempt, after `failed_attempts` failures."""
        asked = retry_after_of(exc) if exc is not None else None
        if asked is not None:
            return min(asked, self.max_retry_after)
        n = max(failed_attempts, 1)
        try:
            grown = self.base_delay * self.multiplier ** (n - 1)
        except OverflowError:  # 2.0 ** 1024, at attempt 1,025: past max_delay long before
            grown = self.max_delay if self.base_delay > 0 else 0.0
        raw = min(self.max_delay, grown)
        r = (rng or random).random()
        return raw * (1.0 - self.jitter * r)
