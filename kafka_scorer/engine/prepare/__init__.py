"""The prepare stage: a job becomes a `PreparedJob` (token ids, items, labels, templates,
documents, chunk windows) on a prepare thread, before it is queued; no tensor is made here."""
