"""The wire contract: the job and result structs (protocol.py), their JSON Schemas and AsyncAPI document
(contract.py), and the Schema Registry framing of results (registry.py). Nothing here imports torch or
aiokafka: a client that only speaks the contract imports this package alone."""
