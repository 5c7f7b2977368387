"""The run stage: a `ForwardBatch` through the model to score rows on the device thread, and a
failed batch bisected until the job that breaks it stands alone."""
