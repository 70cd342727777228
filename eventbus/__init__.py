"""The event bus: Kafka behind a small interface, with two client backends.

``open_bus(choice)`` returns the backend named by ``choice`` (a setting,
``LIFTGATE_KAFKA_CLIENT``): ``confluent`` (librdkafka, the default when importable),
``python`` (kafka-python, pure Python), or ``auto`` (confluent when it can be imported,
else python). The choice is made once in an entry point and passed down.
"""

from __future__ import annotations

import logging

from eventbus.interface import (
    Bus,
    BusError,
    BusFatal,
    BusUnavailable,
    ClientChoice,
    CommitFailed,
    Consumer,
    ConsumerOptions,
    DeliveryCallback,
    Message,
    Producer,
    ProducerOptions,
    RevokeCallback,
    TopicPartition,
)

__all__ = [
    "Bus",
    "BusError",
    "BusFatal",
    "BusUnavailable",
    "ClientChoice",
    "CommitFailed",
    "Consumer",
    "ConsumerOptions",
    "DeliveryCallback",
    "Message",
    "Producer",
    "ProducerOptions",
    "RevokeCallback",
    "TopicPartition",
    "open_bus",
]

log = logging.getLogger(__name__)


def open_bus(choice: ClientChoice = "auto") -> Bus:
    """The backend for ``choice``; ImportError when the one named explicitly is not installed."""
    if choice == "auto":
        try:
            from eventbus.confluent import ConfluentBus
        except ImportError as exc:
            log.warning(
                "confluent-kafka cannot be imported (%s): using kafka-python (more CPU per event)", exc
            )
            choice = "python"
        else:
            return ConfluentBus()
    if choice == "confluent":
        from eventbus.confluent import ConfluentBus

        return ConfluentBus()
    if choice == "python":
        from eventbus.kafka_python import PythonBus

        return PythonBus()
    raise ValueError(f"unknown Kafka client {choice!r}: auto, confluent or python")
