"""The packaged job's Kafka source: Spark's option names checked before Spark starts, and a probe
that proves the brokers accept those settings before any data moves.

Users configure Spark's Kafka source by Spark's own names (`[kafka.options]`), so any consumer
setting (`kafka.security.protocol`, `kafka.sasl.*`, `kafka.ssl.*`, ...) reaches the Kafka client
unchanged; the probe checks those names against the consumer's own (a misspelt one is refused with a
did-you-mean before any data moves). The few options the sink owns, and the ones that would break exactly-once, are refused
with the key to use instead.
"""
from __future__ import annotations

import difflib
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, KafkaUnreachableError  # KafkaUnreachableError moved to errors.py

#: Spark's Kafka source options for streaming reads (names are case-insensitive in Spark), other
#: than the `kafka.`-prefixed consumer settings, which all pass through.
SPARK_SOURCE_OPTIONS = (
    "assign", "subscribePattern", "startingTimestamp", "startingOffsetsByTimestamp",
    "startingOffsetsByTimestampStrategy", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions",
    "maxRecordsPerPartition", "groupIdPrefix", "includeHeaders", "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
)
#: Options with a key of the sink's own, which also knows their defaults and checks their values.
OWNED_OPTIONS = {
    "kafka.bootstrap.servers": "kafka.bootstrap_servers",
    "subscribe": "kafka.topics",
    "startingOffsets": "kafka.starting_offsets",
    "maxOffsetsPerTrigger": "kafka.max_offsets_per_trigger",
}
_REFUSED = {
    "failOnDataLoss": "the sink always fails on data loss: skipping offsets would drop rows silently",
    "endingOffsets": "a streaming job has no end; use trigger.interval = \"available-now\" to drain and stop",
    "endingTimestamp": "a streaming job has no end; use trigger.interval = \"available-now\" to drain and stop",
    "endingOffsetsByTimestamp": "a streaming job has no end; use trigger.interval = \"available-now\" to drain and stop",
    # Spark manages these consumer settings itself and refuses them at query start.
    "kafka.auto.offset.reset": "Spark manages it; use kafka.starting_offsets",
    "kafka.enable.auto.commit": "Spark never commits offsets to Kafka; its checkpoint holds them",
    "kafka.key.deserializer": "Spark reads keys and values as bytes",
    "kafka.value.deserializer": "Spark reads keys and values as bytes",
    "kafka.interceptor.classes": "Spark refuses consumer interceptors",
}
_SUBSCRIPTIONS = ("subscribe", "subscribepattern", "assign")
#: Kafka record fields the job can write into every data table, as column `kafka_<field>`.
METADATA_FIELDS = ("topic", "partition", "offset", "timestamp", "key")


@dataclass(frozen=True)
class KafkaSource:
    """What the job reads: one of `topics` or a subscription in `options` (subscribePattern, assign)."""

    bootstrap_servers: str
    topics: list[str] | None
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    options: dict[str, str] = field(default_factory=dict, repr=False)  # may carry a JAAS password

    def reader_options(self) -> dict[str, str]:
        """Every option of the streaming read, in Spark's names."""
        options = {"kafka.bootstrap.servers": self.bootstrap_servers, "startingOffsets": self.starting_offsets,
                   "failOnDataLoss": "true", **self.options}
        if self.topics is not None:
            options["subscribe"] = ",".join(self.topics)
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return options

    def client_properties(self) -> dict[str, str]:
        """The Kafka client settings Spark derives from the options (the `kafka.` prefix removed)."""
        return {key[len("kafka."):]: value for key, value in self.reader_options().items() if key.startswith("kafka.")}

    def option(self, name: str) -> str | None:
        """An option's value by its Spark name, which Spark reads case-insensitively."""
        return next((value for key, value in self.options.items() if key.lower() == name.lower()), None)

    def describe(self) -> str:
        """Where the job reads, without any setting that may hold a secret."""
        pattern = self.option("subscribePattern")
        what = (f"topics {self.topics}" if self.topics is not None else
                f"subscribePattern {pattern!r}" if pattern is not None else f"assign {self.option('assign')}")
        protocol = self.options.get("kafka.security.protocol", "PLAINTEXT")
        return f"{self.bootstrap_servers} ({protocol}), {what}"


def check_options(raw: Mapping[str, Any], key_prefix: str = "kafka.options") -> dict[str, str]:
    """Spark option name -> string value; an unknown, owned or unsafe name is a ConfigurationError."""
    known = {name.lower(): name for name in SPARK_SOURCE_OPTIONS}
    owned_keys = {k.lower(): v for k, v in OWNED_OPTIONS.items()}
    refusals = {k.lower(): v for k, v in _REFUSED.items()}
    options: dict[str, str] = {}
    for name, value in raw.items():
        where = f'{key_prefix}."{name}"' if "." in name else f"{key_prefix}.{name}"
        owned = owned_keys.get(name.lower())
        if owned:
            raise ConfigurationError(f"{where}: set it with the key {owned!r} instead")
        refused = refusals.get(name.lower())
        if refused:
            raise ConfigurationError(f"{where} is not allowed: {refused}")
        if not name.lower().startswith("kafka.") and name.lower() not in known:
            hint = difflib.get_close_matches(name, [*SPARK_SOURCE_OPTIONS, *OWNED_OPTIONS], n=1)
            raise ConfigurationError(
                f"unknown Spark Kafka source option {where}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + "; consumer settings take the 'kafka.' prefix, e.g. \"kafka.security.protocol\"")
        if isinstance(value, dict) and set(value) == {"env"}:  # a secret kept out of the file
            value = _from_environment(value["env"], where)
        if isinstance(value, bool):
            value = "true" if value else "false"
        if not isinstance(value, (str, int, float)) or isinstance(value, float) and value != value:
            raise ConfigurationError(f"{where}: {value!r} is not a string, number or boolean")
        options[known.get(name.lower(), name)] = str(value)
    subscriptions = [n for n in options if n.lower() in _SUBSCRIPTIONS]
    if len(subscriptions) > 1:
        raise ConfigurationError(f"{key_prefix}: give only one of subscribePattern or assign, not {subscriptions}")
    if "assign" in options:
        _check_assign(options["assign"], f"{key_prefix}.assign")
    return options


def _from_environment(variable: Any, where: str) -> str:
    if not isinstance(variable, str) or variable not in os.environ:
        raise ConfigurationError(f"{where}: environment variable {variable!r} is not set")
    return os.environ[variable]


def check_starting_offsets(value: Any, key: str = "kafka.starting_offsets") -> str:
    """`earliest`, `latest`, or JSON `{"topic": {"partition": offset}}` with -2 (earliest) / -1 (latest)."""
    if value in ("earliest", "latest"):
        return str(value)
    hint = ('write "earliest", "latest", or JSON such as \'{"events": {"0": 1234, "1": -2}}\' '
            "(-2 is earliest, -1 latest)")
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except json.JSONDecodeError as error:
        raise ConfigurationError(f"{key}: {value!r} is not valid JSON ({error}); {hint}") from None
    if not isinstance(parsed, dict) or not parsed or not all(
        isinstance(partitions, dict) and partitions and all(
            re.fullmatch(r"\d+", p) and isinstance(o, int) and not isinstance(o, bool) and o >= -2
            for p, o in partitions.items())
        for partitions in parsed.values()
    ):
        raise ConfigurationError(f"{key}: {value!r} is not a starting position; {hint}")
    return str(value)


def _check_assign(value: str, key: str) -> None:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as error:
        raise ConfigurationError(f"{key}: {value!r} is not valid JSON ({error}); write e.g. '{{\"events\": [0, 1]}}'") from None
    if not isinstance(parsed, dict) or not parsed or not all(
        isinstance(p, list) and p and all(isinstance(i, int) and i >= 0 for i in p) for p in parsed.values()
    ):
        raise ConfigurationError(f"{key}: {value!r} must map each topic to a list of partitions, e.g. '{{\"events\": [0, 1]}}'")


def assigned_topics(source: KafkaSource) -> list[str] | None:
    """The topics the job reads when they are known before reading (not with a pattern)."""
    if source.topics is not None:
        return source.topics
    assign = source.option("assign")
    return sorted(json.loads(assign)) if assign is not None else None


def consumer_config_names(spark: Any) -> set[str]:
    """The settings the Kafka consumer Spark runs knows (kafka-clients' `ConsumerConfig.configNames()`)."""
    return {str(name) for name in spark._jvm.org.apache.kafka.clients.consumer.ConsumerConfig.configNames()}


def check_consumer_options(source: KafkaSource, known: set[str], key_prefix: str = "kafka.options") -> list[str]:
    """Refuse a `kafka.*` option the consumer does not know when it is close to one it does (a typo such as
    `kafka.security.protocl` would otherwise be ignored by Kafka and the job run on the defaults); return the
    other unknown ones (a login module or plugin may read its own settings) for a warning."""
    unknown = []
    for name in source.options:
        if not name.lower().startswith("kafka.") or name[len("kafka."):] in known:
            continue
        where = f'{key_prefix}."{name}"'
        hint = difflib.get_close_matches(name[len("kafka."):], sorted(known), n=1, cutoff=0.8)
        if hint:
            raise ConfigurationError(f"{where} is not a Kafka consumer setting (did you mean \"kafka.{hint[0]}\"?); "
                                     "Kafka would ignore it")
        unknown.append(where)
    return unknown


def probe(spark: Any, source: KafkaSource, timeout_s: float = 30.0) -> str:
    """What `read_topics` finds, in a line."""
    return describe_topics(source, read_topics(spark, source, timeout_s))


def describe_topics(source: KafkaSource, topics: list[str]) -> str:
    """The probe's line for the topics the job reads now."""
    if assigned_topics(source) is not None:
        return f"{source.describe()}: reachable, topics exist"
    return f"{source.describe()}: reachable, pattern matches {len(topics)} topic(s) now {topics[:5]}"


def read_topics(spark: Any, source: KafkaSource, timeout_s: float = 30.0) -> list[str]:
    """The topics the job reads now (a pattern's matches at this moment), listed with the Kafka client Spark uses
    and the settings the job reads with.

    Runs in the driver's JVM before the query starts, so a wrong password, an untrusted
    certificate or a missing topic stops the job with one clear line instead of a failed batch.
    """
    jvm = spark._jvm
    for where in check_consumer_options(source, consumer_config_names(spark)):
        logging.getLogger("streaming_sink").warning(
            "%s is not a setting of the Kafka consumer; passed on for a plugin that may read it", where)
    properties = jvm.java.util.Properties()
    for key, value in source.client_properties().items():
        properties.setProperty(key, value)
    properties.setProperty("client.id", "streaming-sink-probe")
    admin = None
    try:
        admin = jvm.org.apache.kafka.clients.admin.AdminClient.create(properties)
        names = set(admin.listTopics().names().get(int(timeout_s * 1000), jvm.java.util.concurrent.TimeUnit.MILLISECONDS))
    except Exception as error:  # Py4JJavaError: the root cause says what the broker refused
        cause = root_cause(error)
        if cause.endswith(": None"):  # a timeout carries no message
            cause = (f"no answer in {timeout_s:g} s; check that the brokers are reachable from here and that "
                     "kafka.security.protocol is the listener's")
        cause += _what_to_set(cause)
        raise KafkaUnreachableError(f"Kafka at {source.describe()}: {cause}") from None
    finally:
        if admin is not None:
            admin.close(jvm.java.time.Duration.ZERO)  # a call still pending would hold the default close for 60 s
    wanted = assigned_topics(source)
    if wanted is not None:
        missing = sorted(set(wanted) - names)
        if missing:
            raise KafkaUnreachableError(f"Kafka at {source.describe()}: topic(s) {missing} do not exist")
        return sorted(wanted)
    pattern = source.option("subscribePattern") or ""
    return sorted(n for n in names if re.fullmatch(pattern, n))


def _what_to_set(cause: str) -> str:
    """The job's key for a Kafka client error that names only the JVM's way (a SASL login without its JAAS entry)."""
    if "JAAS configuration" in cause:
        return '; give the login in kafka.options."kafka.sasl.jaas.config"'
    return ""


def root_cause(error: BaseException) -> str:
    """The innermost Java exception's class and message, instead of a Py4J stack trace."""
    java = getattr(error, "java_exception", None)
    if java is None:
        return f"{type(error).__name__}: {error}"
    while java.getCause() is not None:
        java = java.getCause()
    return f"{java.getClass().getSimpleName()}: {java.getMessage()}"
