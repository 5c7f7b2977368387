"""`./dev gpu-check`: the orchestration of a lent GPU's checks (the CUDA tier and the benches, each step
its own process within one time budget). Developer tooling, outside the wheel, as the benches it runs
are (`kafka-scorer bench` and `python -m kafka_scorer_bench.*`, from the checkout it puts on the path)."""
