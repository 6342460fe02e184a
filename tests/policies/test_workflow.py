"""policies/workflow.py: the one selector of a workflow, shared by `distill export` and routing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from policies.workflow import Selector, WorkflowParams, build_workflows, match
from router.learning.distill import export


def test_the_export_and_routing_share_one_selector() -> None:
    assert export.Selector is Selector
    (wf,) = build_workflows(
        [WorkflowParams(name="gsm8k", tier="student", tags={"workflow": "gsm8k"}, teams=["m"])],
        "auto",
        "large",
    )
    assert wf.teacher == "large" and wf.reason == "workflow gsm8k -> student"
    rows = [
        ("m", "auto", {"workflow": "gsm8k"}),
        ("m", "auto", {"workflow": "other"}),
        ("x", "auto", {"workflow": "gsm8k"}),
        ("m", "other", {"workflow": "gsm8k"}),
        ("m", "auto", {}),
    ]
    as_export = Selector(("m",), ("auto",), {"workflow": "gsm8k"})
    routed = [match([wf], t, p, {"metadata": m}) is wf for t, p, m in rows]
    assert routed == [as_export.matches(t, p, m) for t, p, m in rows]
    assert routed == [True, False, False, False, False]
    assert match([wf], "m", "auto", {"metadata": "not an object"}) is None


def test_a_workflow_must_select_something() -> None:
    with pytest.raises(ValidationError, match="needs teams, tags or clusters"):
        WorkflowParams(name="all", tier="student")
