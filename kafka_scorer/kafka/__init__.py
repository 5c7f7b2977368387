"""The Kafka adapter, shared by the worker and the client: clients and their connection options
(connection.py), the start-up check (preflight.py), retries, outage and log-reset handling, the worker's
consumer and producer with their commit and framing rules, and the Kafka names the rest of the project
uses (records.py, errors.py). The only package that imports aiokafka (tests/test_layout.py); it imports
neither the worker nor the client."""
