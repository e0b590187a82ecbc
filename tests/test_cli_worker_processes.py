"""What ``tasuki worker`` starts: the task worker and, beside it, a compression worker of its own (SPEC §6)."""

from __future__ import annotations

import pytest

from cli.services import option_value, without_options, worker_processes


def queues_of(argv: list[str]) -> str | None:
    return option_value(argv, ("-Q", "--queues"))


def test_by_default_a_task_worker_on_tasks_and_maintenance_and_a_threads_compression_worker() -> None:
    processes = dict(worker_processes(["-c", "2", "--loglevel", "INFO"], compression_concurrency=8))

    assert queues_of(processes["worker"]) == "tasks,maintenance"
    assert option_value(processes["worker"], ("-c",)) == "2"
    compression = processes["compression"]
    assert queues_of(compression) == "compression"
    assert option_value(compression, ("-P",)) == "threads"
    assert option_value(compression, ("-c",)) == "8"  # the task worker's -c is not the compression worker's
    assert option_value(compression, ("-n",)) == "compression-tasuki@%h"
    assert "--loglevel" in compression


@pytest.mark.parametrize(
    "given", [["-Q", "tasks,compression"], ["-Qtasks,compression"], ["--queues=tasks,compression"]]
)
def test_q_narrows_both_and_the_node_name_carries_over(given: list[str]) -> None:
    processes = dict(worker_processes([*given, "-n", "w1@%h"], compression_concurrency=4))

    assert queues_of(processes["worker"]) == "tasks"
    assert option_value(processes["worker"], ("-n",)) == "w1@%h"
    assert option_value(processes["compression"], ("-n",)) == "compression-w1@%h"


def test_without_the_compression_queue_there_is_no_compression_worker_and_only_it_alone_is_one() -> None:
    assert [name for name, _ in worker_processes(["-Q", "maintenance", "-P", "solo"], 8)] == ["worker"]
    assert [name for name, _ in worker_processes(["-Q", "compression"], 8)] == ["compression"]


def test_options_and_their_values_are_removed_in_every_spelling() -> None:
    argv = ["-P", "solo", "-c4", "--concurrency=3", "--pool", "prefork", "-E", "--autoscale", "4,1"]

    assert without_options(argv, ("-P", "--pool", "-c", "--concurrency", "--autoscale")) == ["-E"]
