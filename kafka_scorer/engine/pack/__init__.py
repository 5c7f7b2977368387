"""The pack stage: prepared jobs chosen under the token budget become one `ForwardBatch`
(packed ids, positions, the attention layout, prefix-cache hits), on the pack thread."""
