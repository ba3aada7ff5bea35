"""Models built by hand refuse keywords that are no field: `Step(depends_on=["a"])` made a step
with no dependencies, which ran before the step it was meant to wait for. Loading stays lenient:
a stored document with fields this version does not know (a newer writer's) validates, as every
load of a step with `$refs` relies on."""

from __future__ import annotations

from typing import Any

import pytest

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


def test_a_subclass_of_step_is_a_working_step(tmp_path: Any) -> None:
    """A subclass took Step's change-tracking descriptors for its container fields' defaults:
    every instance held the descriptor object instead of a list or dict, and a commit was
    refused ("Unable to serialize unknown type: _Exposing")."""
    from ckptfs import CheckpointStore

    a, b = PaperStep(id="a", title="a", paper_id="p1"), PaperStep(id="b", title="b", dependencies=["a"])
    assert (a.tool_calls, a.dependencies, a.metadata) == ([], [], {}) and a.metadata is not b.metadata
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
