"""aiokafka's missing-topic flood (issue 45: 1,447 ERROR lines in 20 s) held back, and the worker's own
two lines instead: once that it waits for its request topics, once that they are back."""

from __future__ import annotations

import logging

from kafka_scorer.kafka.missing_topics import CLIENT_LOGGER, MISSING, TopicAbsence


def test_the_flood_is_held_back_and_the_wait_is_said_once_and_its_end_once(caplog) -> None:
    caplog.set_level(logging.INFO)
    absence = TopicAbsence()
    absence.noise.install()
    try:
        absence.observe({"s4.requests": 4}, ["s4.requests"])
        for _ in range(1_447):
            absence.observe({}, ["s4.requests"])  # the consumer looks every few seconds; here, often
            logging.getLogger(CLIENT_LOGGER).error(MISSING, "s4.requests")
        absence.observe({"s4.requests": 4}, ["s4.requests"])
    finally:
        absence.noise.remove()
    assert not [r for r in caplog.records if r.name == CLIENT_LOGGER]
    said = [r for r in caplog.records if r.name == "kafka_scorer.kafka.missing_topics"]
    assert [r.levelno for r in said] == [logging.WARNING, logging.INFO]
    assert "s4.requests" in said[0].getMessage() and "waits for them" in said[0].getMessage()
    assert "1447 Kafka client lines" in said[1].getMessage()


def test_other_client_lines_pass_untouched(caplog) -> None:
    absence = TopicAbsence()
    absence.noise.install()
    try:
        logging.getLogger(CLIENT_LOGGER).error("Topic %s is not authorized for this client", "t")
    finally:
        absence.noise.remove()
    assert [r.levelno for r in caplog.records if r.name == CLIENT_LOGGER] == [logging.ERROR]
