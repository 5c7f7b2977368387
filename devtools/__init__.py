"""Developer tooling that is not part of the product: pyproject packages only `kafka_scorer*`, so nothing
here reaches the wheel. `devtools.apache_kafka` runs a real Apache Kafka broker (KRaft, one JVM) for the
tests and for `./dev kafka`, next to the embedded protocol re-implementations the product ships."""
