"""worker/grading.py's pure parts: the request's ``grading`` as SWE-bench ships its lists, and the verdict on a test
run that timed out or named no test (issue 39; the sandboxed runs are in test_eval_grading_e2e.py)."""

from __future__ import annotations

import json

from worker.grading import Grading, TestRun, judge

UNITTEST_OK = "test_add (test_calc.AddTest.test_add) ... ok\ntest_sub (test_calc.SubTest.test_sub) ... FAIL\n"


def test_grading_reads_lists_and_json_encoded_lists_with_defaults() -> None:
    spec = Grading.from_json({"test_patch": "diff", "fail_to_pass": json.dumps(["a::b"]), "pass_to_pass": ""})
    assert spec == Grading("diff", ("a::b",), (), None, "pytest", None)
    listed = Grading.from_json({"test_patch": "diff", "fail_to_pass": ["x"], "pass_to_pass": ["y"],
                                "test_command": "make test", "parser": "unittest", "timeout_s": 30})
    assert listed == Grading("diff", ("x",), ("y",), "make test", "unittest", 30)


def test_a_run_is_judged_by_its_listed_tests() -> None:
    spec = Grading("diff", ("test_calc.AddTest.test_add",), ("test_calc.SubTest.test_sub",), parser="unittest")
    graded = judge(TestRun(UNITTEST_OK, 1, ran=True), spec)
    assert graded.error is None
    assert not graded.resolved
    assert graded.failed == ["test_calc.SubTest.test_sub"]


def test_a_run_out_of_time_is_an_error_that_keeps_what_it_reported() -> None:
    spec = Grading("diff", ("test_calc.AddTest.test_add",), parser="unittest")
    graded = judge(TestRun(UNITTEST_OK, None, timed_out=True, ran=True), spec)
    assert graded.error == "the tests timed out"
    assert not graded.resolved
    assert graded.fail_to_pass == {"test_calc.AddTest.test_add": "passed"}


def test_a_run_that_names_no_test_says_why_in_one_line() -> None:
    output = "Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'pytest'\n\n"
    graded = judge(TestRun(output, 1, ran=True), Grading("diff", ("t::a",)))
    assert not graded.resolved
    assert graded.error == ("the test run reported no result (exit code 1): "
                            "ModuleNotFoundError: No module named 'pytest'")
    assert graded.fail_to_pass == {"t::a": "missing"}
