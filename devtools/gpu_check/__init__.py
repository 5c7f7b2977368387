"""`./dev gpu-check`: the orchestration of a lent GPU's checks (the CUDA tier and the benches, each step
its own process within one time budget). Developer tooling, outside the wheel: the benches it runs are
`kafka-scorer bench` and `python -m kafka_scorer.bench.*`, which users have too; only this driver is ours."""
