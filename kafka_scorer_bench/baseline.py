"""The baseline: scoring as a transformers user would write it without this project.

One `query + item` pair per row, rows right-padded into batches, the stock model with SDPA attention,
the full `[rows, length, vocab]` logits, then `log_softmax` over the vocabulary at each row's last
real token and a gather of the label ids. Deliberately independent of `kafka_scorer.engine`: it shares
no code with what it is compared against, so it also serves as the benchmark's correctness check.

It is a competent user's version, not a strawman: inference mode, no KV cache, batches filled up to the
same token budget the engine gets, right padding (so position ids stay exact).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kafka_scorer.wire.protocol import Job


class BaselineScorer:
    def __init__(self, model_path: str, *, dtype: torch.dtype, device: torch.device) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

        config = AutoConfig.from_pretrained(model_path)
        self.causal = config.architectures[0].endswith("ForCausalLM")
        auto = AutoModelForCausalLM if self.causal else AutoModelForSequenceClassification
        self.model = auto.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa")
        self.model.to(device).eval()
        self.device = device
        self.pad_id = int(config.pad_token_id if config.pad_token_id is not None else 0)

    def plan(self, jobs: Sequence[Job], max_batch_tokens: int) -> list[list[tuple[int, int]]]:
        """(job index, item index) rows per padded batch: in order, filled while rows × longest fit."""
        batches: list[list[tuple[int, int]]] = []
        current: list[tuple[int, int]] = []
        longest = 0
        for j, job in enumerate(jobs):
            for i, item in enumerate(job.items):
                length = len(job.query) + len(item)
                if current and (len(current) + 1) * max(longest, length) > max_batch_tokens:
                    batches.append(current)
                    current, longest = [], 0
                current.append((j, i))
                longest = max(longest, length)
        if current:
            batches.append(current)
        return batches

    @torch.inference_mode()
    def score_rows(self, jobs: Sequence[Job], rows: list[tuple[int, int]]) -> tuple[list[list[float]], int]:
        """Scores of the given pairs, in order, and the padded token count the batch computed."""
        pairs = [list(jobs[j].query) + list(jobs[j].items[i]) for j, i in rows]  # type: ignore[arg-type]  # the baseline is sent token-id jobs only
        longest = max(len(p) for p in pairs)
        ids = torch.full((len(pairs), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(pairs), longest), dtype=torch.long)
        for r, pair in enumerate(pairs):
            ids[r, : len(pair)] = torch.tensor(pair)
            mask[r, : len(pair)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        if not self.causal:
            # The classification model pools at the last non-pad token itself.
            scores = logits.float()
            out = [
                (torch.softmax(s, -1) if jobs[j].apply_softmax else s).tolist()
                for s, (j, _) in zip(scores, rows)
            ]
            return out, ids.numel()
        last = mask.sum(dim=1) - 1
        final = logits[torch.arange(len(pairs), device=self.device), last].float()
        logprobs = torch.log_softmax(final, dim=-1)
        out = []
        for r, (j, _) in enumerate(rows):
            job = jobs[j]
            labels = torch.tensor(job.label_token_ids, device=self.device)
            if job.apply_softmax:
                out.append(torch.softmax(final[r, labels], -1).tolist())
            else:
                out.append(logprobs[r, labels].exp().tolist())
        return out, ids.numel()

    def score_jobs(self, jobs: Sequence[Job], max_batch_tokens: int) -> tuple[list[list[list[float]]], int]:
        """Per-job score rows, and the padded tokens computed in all."""
        scores: list[list[list[float]]] = [[[] for _ in job.items] for job in jobs]
        padded = 0
        for rows in self.plan(jobs, max_batch_tokens):
            batch_scores, batch_tokens = self.score_rows(jobs, rows)
            padded += batch_tokens
            for (j, i), row in zip(rows, batch_scores):
                scores[j][i] = row
        return scores, padded
