"""Checkpoints made on the spot and written like downloaded ones: tiny random models of every served
family, a tiny ColBERT, and the packaged real MiniLM. For the demo, `kafka-scorer model`, the bench and
the tests; the serving path never imports them."""
