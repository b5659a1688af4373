"""The finished-task message: what batchers publish and long-polls answer from."""

from __future__ import annotations

from brimful.core.task_record import FinishedMessage, TaskRecord, TaskStatus


def test_an_entry_carries_the_task_s_model_and_provenance() -> None:
    entry = b'4f2a\ndone\n100\n130\nacme\nbrimful_reference_16\n{"rows":3}\noutputs\n{"LENGTH":[2],"T":"a\\nb"}'
    record = FinishedMessage.record(entry)
    assert (record.model, record.provenance, record.outputs) == (
        "brimful_reference_16",
        {"rows": 3},
        {"LENGTH": [2], "T": "a\nb"},
    )


def test_an_entry_from_a_batcher_before_provenance_reads_with_none() -> None:
    # Eight fields, as a batcher of the release before provenance publishes them during an upgrade.
    entry = b'4f2a\ndone\n100\n130\nacme\nbrimful_reference_16\noutputs\n{"LENGTH":[2],"T":"a\\nb"}'
    assert FinishedMessage.record(entry) == TaskRecord(
        task_id="4f2a",
        status=TaskStatus.DONE,
        submitted_at_ms=100,
        updated_at_ms=130,
        outputs={"LENGTH": [2], "T": "a\nb"},
        error=None,
        tenant="acme",
        model="brimful_reference_16",
    )


def test_an_entry_from_a_batcher_before_models_were_named_reads_with_no_model() -> None:
    # Seven fields, as a batcher of the earlier release publishes them during an upgrade.
    entry = b'4f2a\nfailed\n100\n130\nacme\nerror\n{"class":"model_error"}'
    record = FinishedMessage.record(entry)
    assert (record.model, record.tenant, record.error, record.outputs) == ("", "acme", {"class": "model_error"}, None)


def test_a_cancelled_task_has_no_stored_field() -> None:
    for entry in (b"4f2a\ncancelled\n100\n130\nacme\nm\n\n\n", b"4f2a\ncancelled\n100\n130\nacme\nm\n\n"):
        record = FinishedMessage.record(entry)
        assert (record.status, record.model, record.outputs, record.error, record.provenance) == (
            TaskStatus.CANCELLED,
            "m",
            None,
            None,
            None,
        )
