"""The server's per-run history of rank figures stays bounded in samples and in runs."""

from jupyter_ext.rank_history import RankHistory


def _ranks(cpu):
    return [{"rank": 0, "cpu_percent": cpu, "rss_bytes": 100}, {"rank": 1, "cpu_percent": None}]


def test_a_runs_history_keeps_only_the_newest_samples():
    history = RankHistory(max_samples=3)
    for t in range(5):
        history.add("run-a", float(t), _ranks(float(t * 10)))
    series = history.series("run-a")
    assert series["t"] == [2.0, 3.0, 4.0]
    assert series["ranks"]["0"]["cpu_percent"] == [20.0, 30.0, 40.0]
    assert series["ranks"]["1"]["rss_bytes"] == [None, None, None]  # a figure a rank lacked is a gap


def test_the_run_asked_about_longest_ago_is_forgotten_first():
    history = RankHistory(max_runs=2)
    history.add("run-a", 1.0, _ranks(1.0))
    history.add("run-b", 2.0, _ranks(2.0))
    history.add("run-a", 3.0, _ranks(3.0))  # run-a is the newer one now
    history.add("run-c", 4.0, _ranks(4.0))
    assert history.series("run-b") == {"t": [], "ranks": {}}
    assert history.series("run-a")["t"] == [1.0, 3.0]


def test_a_rank_that_appears_later_has_gaps_before_it():
    history = RankHistory()
    history.add("run-a", 1.0, [{"rank": 0, "rss_bytes": 5}])
    history.add("run-a", 2.0, [{"rank": 0, "rss_bytes": 6}, {"rank": 1, "rss_bytes": 7}])
    assert history.series("run-a")["ranks"]["1"]["rss_bytes"] == [None, 7]
