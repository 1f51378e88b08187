"""bench/timeline.py's reading of Spark's event log: the share of a run's window by tasks running, and
task time per stage, from a hand-made event log."""

import json

from bench.timeline import concurrency, read_event_log, run_timeline


def test_concurrency_counts_the_time_by_tasks_open_within_the_window():
    # Two tasks overlap from 1 to 3; nothing runs from 4 to 5; the last task runs past the window.
    assert concurrency([(0, 4), (1, 3), (5, 9)], 0, 6) == {0: 1.0, 1: 3.0, 2: 2.0}
    assert concurrency([], 10, 12) == {0: 2.0}


def test_a_run_timeline_from_an_event_log(tmp_path):
    def task(stage, launch_ms, finish_ms):
        return {"Event": "SparkListenerTaskEnd", "Stage ID": stage,
                "Task Info": {"Launch Time": launch_ms, "Finish Time": finish_ms}}

    def stage(stage_id, name, submitted_ms, completed_ms):
        return {"Event": "SparkListenerStageCompleted",
                "Stage Info": {"Stage ID": stage_id, "Stage Name": name, "Submission Time": submitted_ms,
                               "Completion Time": completed_ms}}

    events = [
        stage(0, "start at NativeMethodAccessorImpl.java:0", 1_000, 1_300),
        task(0, 1_000, 1_250), task(0, 1_000, 1_200), task(0, 1_250, 1_300),
        stage(1, "call at /somewhere/python.py:1", 1_300, 2_300),
        task(1, 1_300, 2_300), task(1, 1_300, 2_100),
        stage(2, "call at /somewhere/python.py:1", 5_000, 6_000),  # after the window: left out
        task(2, 5_000, 6_000),
        {"Event": "SparkListenerJobStart"},
    ]
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "events").write_text("".join(json.dumps(e) + "\n" for e in events))
    tasks, stages = read_event_log(str(tmp_path))
    timeline = run_timeline(tasks, stages, [1.0, 2.5], records=500_000)
    assert timeline["window_s"] == 1.5
    # 2 tasks: 1.0-1.2 and 1.3-2.1 (1.0 s); 1 task: 1.2-1.3 (the third source task starts as the
    # first ends) and 2.1-2.3 (0.3 s); none from 2.3 to the window's end (0.2 s).
    assert timeline["share_by_tasks_running"] == {0: round(0.2 / 1.5, 3), 1: round(0.3 / 1.5, 3),
                                                   2: round(1.0 / 1.5, 3)}
    assert timeline["stages"] == {
        "call": {"stages": 1, "tasks_per_stage": 2.0, "task_s_per_1e6_records": 3.6},
        "start": {"stages": 1, "tasks_per_stage": 3.0, "task_s_per_1e6_records": 1.0},
    }
