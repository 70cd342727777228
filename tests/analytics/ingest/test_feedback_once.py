"""Yes/no feedback counts once per response and kind, and a zero never counts as a yes."""

from __future__ import annotations

from typing import Any

from analytics.ingest.write import ingest
from contracts.events import FeedbackEvent
from tests.analytics.ingest_helpers import (
    connect,
    declared_experiment,
    feedback,
    interaction,
    while_waiting_commit,
)


def _unit(conn: Any, exp: int, unit: str) -> dict[str, float]:
    row = conn.execute(
        b"SELECT thumbs_up, thumbs_down, copies, task_success_n, task_success_sum, ratings_n"
        b" FROM unit_rollups WHERE experiment_id = %s AND unit_id = %s",
        (exp, unit),
    ).fetchone()
    assert row is not None
    names = ("thumbs_up", "thumbs_down", "copies", "task_success_n", "task_success_sum", "ratings_n")
    return dict(zip(names, (float(v) for v in row), strict=True))


def test_fifty_thumbs_up_for_one_response_count_as_one_in_one_batch_and_across_batches(
    database_url: str,
) -> None:
    exp = declared_experiment(database_url)
    first, second = interaction(exp, "control", "u1"), interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [first, second, *(feedback(first, "thumbs_up") for _ in range(30))])
        ingest(conn, [feedback(first, "thumbs_up") for _ in range(20)])
        ingest(conn, [feedback(second, "thumbs_up"), feedback(second, "thumbs_up")])
        stored = conn.execute(b"SELECT count(*) FROM feedback WHERE request_id = %s", (first.request_id,))
        n_stored = stored.fetchone()
        got = _unit(conn, exp, "u1")
    assert n_stored == (50,)  # every event is kept as sent
    assert got["thumbs_up"] == 2.0  # one per response


def test_a_zero_is_never_a_yes_and_a_later_one_still_counts(database_url: str) -> None:
    exp = declared_experiment(database_url)
    i = interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [i, feedback(i, "thumbs_up", 0.0), feedback(i, "copy", 0.0), feedback(i, "copy", -1.0)])
        after_zeros = _unit(conn, exp, "u1")
        ingest(conn, [feedback(i, "thumbs_up", 1.0)])
        got = _unit(conn, exp, "u1")
    assert after_zeros["thumbs_up"] == 0.0 and after_zeros["copies"] == 0.0
    assert got["thumbs_up"] == 1.0 and got["copies"] == 0.0


def test_a_thumbs_down_after_a_thumbs_up_counts_one_of_each(database_url: str) -> None:
    exp = declared_experiment(database_url)
    i = interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [i, feedback(i, "thumbs_up")])
        ingest(conn, [feedback(i, "thumbs_down"), feedback(i, "thumbs_up"), feedback(i, "thumbs_down")])
        got = _unit(conn, exp, "u1")
    assert (got["thumbs_up"], got["thumbs_down"]) == (1.0, 1.0)


def test_task_success_counts_its_first_report_per_response_zero_included(database_url: str) -> None:
    exp = declared_experiment(database_url)
    a, b = interaction(exp, "control", "u1"), interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [a, b, feedback(a, "task_success", 0.0), feedback(a, "task_success", 1.0)])
        ingest(conn, [feedback(b, "task_success", 1.0), feedback(b, "task_success", 1.0)])
        # Ratings are values, not yes/no: each one counts.
        ingest(conn, [feedback(a, "rating", 4.0), feedback(a, "rating", 5.0)])
        got = _unit(conn, exp, "u1")
    assert (got["task_success_n"], got["task_success_sum"]) == (2.0, 1.0)
    assert got["ratings_n"] == 2.0


def test_repeats_stored_before_their_interaction_count_once_when_it_arrives(database_url: str) -> None:
    exp = declared_experiment(database_url)
    i = interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [feedback(i, "thumbs_up") for _ in range(5)])  # unattributed for now
        res = ingest(conn, [i])
        got = _unit(conn, exp, "u1")
    assert res.attributed == 5  # all five now carry the experiment ...
    assert got["thumbs_up"] == 1.0  # ... one is counted


def test_concurrent_batches_with_the_same_thumbs_up_count_it_once(database_url: str) -> None:
    """Two transactions count the same response's thumbs-up: the second waits on the first's
    feedback_counted row and, once that commits, counts nothing."""
    exp = declared_experiment(database_url)
    i = interaction(exp, "control", "u1")
    with connect(database_url) as conn:
        ingest(conn, [i])
    with connect(database_url) as a, connect(database_url) as b:
        a.execute(b"BEGIN")
        ingest(a, [feedback(i, "thumbs_up")])  # nested in a's open transaction
        late: FeedbackEvent = feedback(i, "thumbs_up")
        result = while_waiting_commit(a, lambda: ingest(b, [late]))  # b waits on a's row
        got = _unit(a, exp, "u1")
    assert result.feedback == 1
    assert got["thumbs_up"] == 1.0
