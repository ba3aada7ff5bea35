"""Models built by hand refuse keywords that are no field: `Step(depends_on=["a"])` made a step
with no dependencies, which ran before the step it was meant to wait for. Loading stays lenient:
a stored document with fields this version does not know (a newer writer's) validates, as every
load of a step with `$refs` relies on."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import AliasChoices, ConfigDict, Field

from ckptfs import AgentRun, Step, ToolCall


@pytest.mark.parametrize(("model", "kwargs", "bad", "hint"), [
    (Step, {"id": "b", "title": "b", "depends_on": ["a"]}, "'depends_on'", "'dependencies'"),
    (Step, {"id": "b", "title": "b", "milestone": True, "retries": 3, "zzz": 1}, "'retries', 'zzz'", None),
    (AgentRun, {"goal": "g", "stepz": {}}, "'stepz'", "'steps'"),
    (ToolCall, {"tool": "search", "arguments": {}}, "'tool'", "'tool_name'"),
])
def test_an_unknown_keyword_is_a_type_error_naming_it(model: Any, kwargs: dict[str, Any], bad: str,
                                                      hint: str | None) -> None:
    with pytest.raises(TypeError) as info:
        model(**kwargs)
    msg = str(info.value)
    assert f"{model.__name__}() got unexpected keyword argument(s) {bad}" in msg
    assert (f"did you mean {hint}?" in msg) if hint else "did you mean" not in msg
    assert "its fields are " in msg and ("id" in msg or "goal" in msg)


def test_the_seed_shapes_still_build() -> None:
    run = AgentRun(goal="demo")
    run.add_step(Step(id="s1", title="Fetch data from API"))
    run.add_step(Step(id="s2", title="Process", description="d", dependencies=["s1"]))
    call = ToolCall(tool_name="fetch", arguments={"url": "u"})
    assert [s.id for s in run.get_ready_steps()] == ["s1"] and call.phase == "completed"


def test_loading_ignores_fields_it_does_not_know() -> None:
    step = Step.model_validate({"id": "a", "title": "t", "priority": 3, "$refs": {}})
    run = AgentRun.model_validate({"goal": "g", "schema": 9, "steps": {
        "a": {"id": "a", "title": "t", "depends_on": ["x"], "dependencies": ["y"]}}})
    call = ToolCall.model_validate({"tool_name": "t", "arguments": {}, "cost_class": "paid"})
    assert step.id == "a" and run.steps["a"].dependencies == ["y"] and call.tool_name == "t"
    assert step.model_copy(update={"title": "u"}).title == "u"  # copies never pass the check


class PaperStep(Step):
    """What a user writes to give steps a typed field of their own."""

    paper_id: str = ""


class NamedStep(Step):
    """A subclass that adds behaviour, no field."""

    @property
    def label(self) -> str:
        return f"{self.id}: {self.title}"


def test_a_subclass_of_step_is_a_working_step(tmp_path: Any) -> None:
    """A subclass took Step's change-tracking descriptors for its container fields' defaults:
    every instance held the descriptor object instead of a list or dict, and a commit was
    refused ("Unable to serialize unknown type: _Exposing"). One without fields of its own
    stores as a Step, in-place changes heard."""
    from ckptfs import CheckpointStore

    a, b = NamedStep(id="a", title="a"), NamedStep(id="b", title="b", dependencies=["a"])
    assert (a.tool_calls, a.dependencies, a.metadata) == ([], [], {}) and a.metadata is not b.metadata
    assert a.label == "a: a" and PaperStep(id="p", title="p").tool_calls == []
    run = AgentRun(run_id="papers", goal="g")
    run.add_step(a)
    run.add_step(b)
    with CheckpointStore(str(tmp_path)) as store:
        store.save_run(run)
        a.metadata["pages"] = 12  # changed in place: the store must hear of it
        store.save_run(run)
    with CheckpointStore(str(tmp_path)) as fresh:
        loaded = fresh.load_run("papers")
    assert loaded is not None and loaded.steps["a"].metadata == {"pages": 12}
    assert loaded.steps["b"].dependencies == ["a"]


def test_a_field_a_subclass_adds_is_refused_at_commit(tmp_path: Any) -> None:
    """A load builds Step, which ignores `paper_id`: stored, the value was acknowledged and
    never came back (a resumed run then committed the step without it). Refused, nothing
    written, naming the field and where to keep it instead."""
    from ckptfs import CheckpointStore
    from ckptfs.errors import UnstorableValueError

    run = AgentRun(run_id="papers", goal="g")
    run.add_step(PaperStep(id="a", title="a", paper_id="p1"))
    with CheckpointStore(str(tmp_path)) as store:
        with pytest.raises(UnstorableValueError, match=r"step 'a': paper_id: a field of PaperStep, "
                                                       r"a subclass of Step.*\.metadata"):
            store.save_run(run)
        assert store.load_run("papers") is None
        run.steps["a"] = Step(id="a", title="a", metadata={"paper_id": "p1"})
        store.save_run(run)  # the next commit works
    with CheckpointStore(str(tmp_path)) as fresh:
        loaded = fresh.load_run("papers")
    assert loaded is not None and loaded.steps["a"].metadata == {"paper_id": "p1"}


class AliasedStep(Step):
    paper_id: str = Field("", alias="paperId")


class ChoiceStep(Step):
    model_config = ConfigDict(validate_assignment=True, populate_by_name=True)
    paper_id: str = Field("", validation_alias=AliasChoices("paperId", "pid"))


class FromPaper(Step):
    """A constructor of the user's own: its signature says what it takes."""

    def __init__(self, paper: str, **kw: Any) -> None:
        super().__init__(id=paper, title=f"read {paper}", **kw)


class OpenStep(Step):
    model_config = ConfigDict(validate_assignment=True, extra="allow")


def test_what_pydantic_takes_a_subclass_takes_too() -> None:
    """The check refused every keyword that was not a field name: a subclass's aliases
    (`Field(alias=...)`, `validation_alias`), the keywords of its own `__init__`, and the extra
    fields of an `extra="allow"` model were all TypeErrors, so such subclasses could not be
    built at all."""
    assert AliasedStep(id="a", title="t", paperId="p").paper_id == "p"
    assert ChoiceStep(id="a", title="t", pid="p").paper_id == "p"
    assert ChoiceStep(id="a", title="t", paper_id="p").paper_id == "p"  # populate_by_name
    assert FromPaper(paper="p1", milestone=True).title == "read p1"
    assert OpenStep(id="a", title="t", source="web").model_extra == {"source": "web"}
    with pytest.raises(TypeError, match=r"'paper_id'.*did you mean 'paperId'"):
        AliasedStep(id="a", title="t", paper_id="p")  # pydantic would drop it: no populate_by_name
    with pytest.raises(TypeError, match="'depends_on'"):
        ChoiceStep(id="a", title="t", depends_on=["x"])


def test_a_typo_in_a_nested_dict_is_refused_too() -> None:
    """`AgentRun(steps={"b": {..., "depends_on": ["a"]}})` made step b with no dependencies (it
    ran first), and `Step(tool_calls=[{"tool": ...}])` lost the key: the dicts of a call were
    validated as a load validates them, where unknown keys are ignored."""
    with pytest.raises(TypeError) as info:
        AgentRun(goal="g", steps={"a": {"id": "a", "title": "a"},
                                  "b": {"id": "b", "title": "b", "depends_on": ["a"]}})
    assert "AgentRun.steps['b'] (Step) has unexpected key(s) 'depends_on'" in str(info.value)
    assert "did you mean 'dependencies'?" in str(info.value)
    with pytest.raises(TypeError, match=r"Step.tool_calls\[0\] \(ToolCall\) has unexpected key\(s\) 'tool'"):
        Step(id="a", title="t", tool_calls=[{"tool": "x", "arguments": {}}])
    with pytest.raises(TypeError, match=r"AgentRun.steps\['a'\].tool_calls\[0\] \(ToolCall\)"):
        AgentRun(goal="g", steps={"a": {"id": "a", "title": "t",
                                        "tool_calls": [{"tool_name": "x", "argumentz": {}}]}})
    run = AgentRun(goal="g", steps={"a": {"id": "a", "title": "a"},
                                    "b": {"id": "b", "title": "b", "dependencies": ["a"]}})
    assert [s.id for s in run.get_ready_steps()] == ["a"]
    # what a load reads stays lenient, nested or not
    assert AgentRun.model_validate({"goal": "g", "steps": {"a": {"id": "a", "title": "a", "zz": 1}}})


def test_an_exported_run_builds_again_by_keywords(tmp_path: Any) -> None:
    """`ckptfs export`'s "run" member is the run's fields: AgentRun(**doc["run"]) rebuilds it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from ckptfs import CheckpointStore

    run = AgentRun(run_id="exp", goal="g")
    run.add_step(Step(id="a", title="a", tool_calls=[ToolCall(tool_name="t", arguments={"q": 1})]))
    run.add_step(Step(id="b", title="b", dependencies=["a"], metadata={"k": [1]}))
    with CheckpointStore(str(tmp_path / "s")) as store:
        store.save_run(run)
    cli = str(Path(sys.executable).parent / "ckptfs")
    out = tmp_path / "e.json"
    proc = subprocess.run([cli, "export", str(tmp_path / "s"), "exp", "--output", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    again = AgentRun(**json.loads(out.read_text())["run"])
    assert again.steps["b"].dependencies == ["a"] and again.steps["a"].tool_calls[0].arguments == {"q": 1}


class CheckedRun(AgentRun):
    """A run whose assignments are validated, as Step's are: `run.steps = {...}` then takes dicts."""

    model_config = ConfigDict(validate_assignment=True)


class CallsStep(Step):
    """Aliases and a field of a subclass's own that holds models, for assignment."""

    model_config = ConfigDict(validate_assignment=True, populate_by_name=True)
    paper_id: str = Field("", alias="paperId")
    more_calls: list[ToolCall] = Field(default_factory=list)


def test_a_typo_in_an_assigned_list_of_dicts_is_refused() -> None:
    """Step validates assignments as a load validates: `step.tool_calls = [{..., "unknown_key":
    1}]` dropped the key, and the commit acknowledged a call the load never gave back."""
    step = Step(id="a", title="t", tool_calls=[ToolCall(tool_name="kept", arguments={})])
    with pytest.raises(TypeError) as info:
        step.tool_calls = [{"tool_name": "x", "arguments": {}, "unknown_key": 1}]
    assert str(info.value).startswith("Step.tool_calls[0] (ToolCall) has unexpected key(s) "
                                      "'unknown_key'; its fields are id, tool_name, arguments")
    with pytest.raises(TypeError, match=r"Step.tool_calls\[1\] \(ToolCall\) has unexpected key\(s\) "
                                        r"'tool' \(did you mean 'tool_name'\?\)"):
        step.tool_calls = [ToolCall(tool_name="y", arguments={}), {"tool": "x", "arguments": {}}]
    assert [c.tool_name for c in step.tool_calls] == ["kept"]  # refused before anything changed
    with pytest.raises(TypeError, match=r"CallsStep.more_calls\[0\] \(ToolCall\) .* 'argumentz'"):
        CallsStep(id="a", title="t").more_calls = [{"tool_name": "x", "arguments": {}, "argumentz": {}}]


def test_a_typo_in_an_assigned_dict_of_dicts_is_refused() -> None:
    run = CheckedRun(goal="g")
    with pytest.raises(TypeError) as info:
        run.steps = {"a": {"id": "a", "title": "a"},
                     "b": {"id": "b", "title": "b", "depends_on": ["a"]}}
    assert "CheckedRun.steps['b'] (Step) has unexpected key(s) 'depends_on'" in str(info.value)
    assert "did you mean 'dependencies'?" in str(info.value)
    assert run.steps == {}


def test_a_typo_deeper_in_an_assigned_dict_is_refused() -> None:
    """A ToolCall dict inside a Step dict inside the steps given to a run."""
    run = CheckedRun(goal="g")
    with pytest.raises(TypeError, match=r"CheckedRun.steps\['a'\].tool_calls\[0\] \(ToolCall\) has "
                                        r"unexpected key\(s\) 'argumentz' \(did you mean 'arguments'\?\)"):
        run.steps = {"a": {"id": "a", "title": "t",
                           "tool_calls": [{"tool_name": "x", "arguments": {}, "argumentz": {}}]}}
    with pytest.raises(TypeError, match=r"Step.tool_calls\[0\] \(ToolCall\) .* 'zz'"):
        Step(id="a", title="t").tool_calls = ({"tool_name": "x", "arguments": {}, "zz": 1},)


def test_a_valid_assignment_still_commits_and_loads(tmp_path: Any) -> None:
    """Dicts with known keys, aliases and model instances are taken as a constructor takes them,
    and what was assigned is what a load gives back."""
    from ckptfs import CheckpointStore

    run = CheckedRun(run_id="assigned", goal="g")
    run.steps = {"a": {"id": "a", "title": "a"},
                 "b": {"id": "b", "title": "b", "dependencies": ["a"],
                       "tool_calls": [{"tool_name": "fetch", "arguments": {"q": 1}, "id": "c1"}]}}
    run.steps = {**run.steps, "c": Step(id="c", title="c")}  # instances alongside, kept as given
    step = run.steps["a"]
    step.tool_calls = [ToolCall(tool_name="t", arguments={}, id="c0"),
                       {"tool_name": "u", "arguments": {"k": [1]}, "result": "r", "id": "c2"}]
    aliased = CallsStep(id="p", title="p")
    aliased.more_calls = [{"tool_name": "x", "arguments": {}}]
    aliased.tool_calls = [{"tool_name": "x", "arguments": {}}]
    assert aliased.more_calls[0].tool_name == "x" == aliased.tool_calls[0].tool_name
    open_step = OpenStep(id="o", title="o")
    open_step.source = "web"  # extra="allow": its extra attributes stay its own
    assert open_step.model_extra == {"source": "web"}
    with CheckpointStore(str(tmp_path)) as store:
        store.save_run(run)
        run.steps["b"].tool_calls = [{"tool_name": "fetch", "arguments": {"q": 2}, "id": "c3"}]
        store.commit(run, [run.steps["b"]])
    with CheckpointStore(str(tmp_path)) as fresh:
        loaded = fresh.load_run("assigned")
    assert loaded is not None
    assert [c.model_dump() for c in loaded.steps["a"].tool_calls] == [
        c.model_dump() for c in step.tool_calls]
    assert [(c.id, c.arguments) for c in loaded.steps["a"].tool_calls] == [("c0", {}), ("c2", {"k": [1]})]
    assert [(c.id, c.arguments) for c in loaded.steps["b"].tool_calls] == [("c3", {"q": 2})]
    assert loaded.steps["b"].dependencies == ["a"] and sorted(loaded.steps) == ["a", "b", "c"]


def test_a_stored_unknown_key_still_loads(tmp_path: Any) -> None:
    """What a newer writer stores (keys this version does not know, in a step and in one of its
    tool calls) loads, and the loaded models take assignments like any other."""
    import json

    from ckptfs import CheckpointStore
    from ckptfs.format import codec
    from ckptfs.format.changes import Changes
    from ckptfs.format.keys import log_key

    run = AgentRun(run_id="newer", goal="g")
    run.add_step(Step(id="a", title="a", tool_calls=[ToolCall(tool_name="t", arguments={})]))
    with CheckpointStore(str(tmp_path)) as store:
        store.save_run(run)
        first = codec.decode(store.storage.get(log_key("newer", 1)), "k").header
        doc = json.loads(run.steps["a"].model_dump_json())
        doc["priority"] = 3
        doc["tool_calls"][0]["cost_class"] = "paid"
        body = Changes(steps={"a": codec.dumps(doc)}).to_json()
        sha = codec.sha256_hex(body)
        header = codec.RecordHeader(
            format=codec.FORMAT_NAME, format_version=codec.FORMAT_VERSION, kind="journal",
            run_id="newer", version=2, base=1, base_hash=first.hash,
            hash=codec.chain_hash(first.hash, sha, 2), body_sha256=sha, writer="newer", time=1.0)
        store.storage.put(log_key("newer", 2), codec.encode(header, body))
    with CheckpointStore(str(tmp_path)) as fresh:
        loaded = fresh.load_run("newer")
        assert loaded is not None and fresh.last_load is not None and fresh.last_load.version == 2
        step = loaded.steps["a"]
        assert step.tool_calls[0].tool_name == "t" and "priority" not in step.model_dump()
        step.tool_calls = [*step.tool_calls, {"tool_name": "u", "arguments": {}}]
        assert fresh.commit(loaded, [step]) == 3


@pytest.mark.parametrize("how", ["added", "replaced", "seed"])
def test_a_dict_put_where_a_step_belongs_is_refused_by_name(tmp_path: Any, how: str) -> None:
    """AgentRun does not validate assignment, so `run.steps["b"] = {...}` (or a whole dict of
    dicts) stores a plain dict. save_run failed with AttributeError ('dict' object has no
    attribute '_ckpt_watch' / 'id'), a traceback that named neither the step nor the mistake.
    Now it is UnstorableValueError naming the step and the type, nothing is written, and the
    run saves once the step is built."""
    from ckptfs import CheckpointStore
    from ckptfs.errors import UnstorableValueError

    with CheckpointStore(str(tmp_path)) as store:
        run = AgentRun(run_id="r", goal="g", steps={"a": Step(id="a", title="a")})
        store.save_run(run)
        with pytest.raises(UnstorableValueError) as info:
            if how == "added":
                run.steps["b"] = {"id": "b", "title": "b"}  # type: ignore[assignment]
                store.save_run(run)
            elif how == "replaced":
                run.steps = {"a": {"id": "a", "title": "a2"}}  # type: ignore[dict-item]
                store.save_run(run)
            else:
                store.save_step_checkpoint("r", {"id": "b", "title": "b"})  # type: ignore[arg-type]
        msg = str(info.value)
        assert "is a dict, not a Step" in msg and "Step(" in msg, msg
        assert ("'b'" in msg) if how != "replaced" else ("'a'" in msg), msg
        assert store.list_versions("r") == [1]
        run.steps = {"a": Step(id="a", title="a"), "b": Step(id="b", title="b")}
        assert store.save_run(run) == 2
    with CheckpointStore(str(tmp_path)) as fresh:
        loaded = fresh.load_run("r")
    assert loaded is not None and sorted(loaded.steps) == ["a", "b"]


@pytest.mark.parametrize("how", ["sync", "async"])
@pytest.mark.parametrize("bad", ["dict", "other-id", "none", "toolcall"])
def test_a_non_step_in_a_run_is_refused_by_its_key_before_a_step_runs(tmp_path: Any, how: str,
                                                                      bad: str) -> None:
    """A value put in `run.steps` of a run the agent had saved: execute_run and aexecute_run
    failed with AttributeError ('dict' object has no attribute 'status') from the schedule,
    and save_run named the step by the dict's own id, or not at all (None, a ToolCall)."""
    import asyncio

    from ckptfs import CheckpointStore, ToolCall
    from ckptfs.errors import UnstorableValueError
    from ckptfs.runtime.agent import CheckpointedAgent

    value: Any = {"dict": {"id": "b", "title": "b"}, "other-id": {"id": "c", "title": "b"},
                  "none": None, "toolcall": ToolCall(tool_name="t", arguments={})}[bad]
    ran: list[str] = []

    def ex(step: Step, prior: list[Any]) -> str:
        ran.append(step.id)
        return "ok"

    async def aex(step: Step, prior: list[Any]) -> str:
        return ex(step, prior)

    with CheckpointStore(str(tmp_path)) as store:
        agent = CheckpointedAgent(store)
        run = agent.start_run("g", [Step(id="a", title="a")], run_id="r")
        run.steps["b"] = value
        for attempt in (lambda: agent.execute_run(run, ex) if how == "sync"
                        else asyncio.run(agent.aexecute_run(run, aex)), lambda: store.save_run(run)):
            with pytest.raises(UnstorableValueError) as info:
                attempt()
            msg = str(info.value)
            assert f"step 'b'{' (a dict whose id is' if bad == 'other-id' else ''}" in msg, msg
            assert "not a Step" in msg, msg
        assert ran == [] and store.list_versions("r") == [1]
