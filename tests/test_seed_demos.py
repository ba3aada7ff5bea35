"""The article's two demos (examples/seed_demos.py) reach what the article promises."""

from __future__ import annotations

import pytest

from examples.seed_demos import demonstrate_idempotency, simulate_document_processing


def test_document_processing_reaches_ten_of_ten(capsys: pytest.CaptureFixture[str]) -> None:
    run = simulate_document_processing()
    assert run is not None
    assert run.completed_count == 10 and run.status == "completed"
    doc5 = run.steps["doc_005"]
    assert doc5.attempt_count == 2  # failed once, retried within the first execute_run
    assert doc5.result == "Extracted 12 entities, 8 relationships from doc_005"
    assert all(s.attempt_count == 1 for sid, s in run.steps.items() if sid != "doc_005")
    out = capsys.readouterr().out
    assert "Completed: 10 / 10" in out and "Status: completed" in out


def test_idempotency_demo_makes_one_real_call(capsys: pytest.CaptureFixture[str]) -> None:
    assert demonstrate_idempotency() == 1
    out = capsys.readouterr().out
    assert "(total real calls: 1) ← no new API call!" in out
