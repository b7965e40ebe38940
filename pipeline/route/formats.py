"""The answer format of a prompt that names none, guessed from the training prompts nearest to it.

A cascade compares answers with the request's answer format (`router_grader`); a plain OpenAI request names none.
`FormatGuess` keeps the embeddings of the training prompts and their graders (the task pool the router was trained
on) and gives a new prompt the grader that at least `share` of its `k` nearest training prompts (cosine) have; a
prompt whose neighbours disagree gets none (-1) and is routed prompt-only. The embeddings are the router's own
(one forward pass serves both the guess and the pick).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pipeline.core.errors import RouterLiteError


class FormatGuess:
    def __init__(self, X: np.ndarray, graders: Sequence[str], k: int = 10, share: float = 0.7):
        X = np.asarray(X, dtype=np.float32)
        if X.ndim != 2 or len(X) != len(graders) or not len(X):
            raise RouterLiteError(f"format guess: {X.shape} embeddings for {len(graders)} graders")
        self.X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
        self.graders = sorted(set(map(str, graders)))
        self.labels = np.array([self.graders.index(str(g)) for g in graders], dtype=np.int64)
        self.k, self.share = min(int(k), len(X)), float(share)

    @property
    def d(self) -> int:
        return int(self.X.shape[1])

    def predict(self, Q: np.ndarray) -> np.ndarray:
        """Index into `graders` per row of `Q`, -1 where fewer than `share` of the k nearest agree."""
        Q = np.asarray(Q, dtype=np.float32)
        Q = Q / np.maximum(np.linalg.norm(Q, axis=1, keepdims=True), 1e-12)
        near = np.argpartition(-(Q @ self.X.T), self.k - 1, axis=1)[:, : self.k]
        votes = np.stack([(self.labels[near] == g).sum(axis=1) for g in range(len(self.graders))], axis=1)
        top = votes.argmax(axis=1)
        return np.where(votes.max(axis=1) >= self.share * self.k, top, -1)

    def guess(self, Q: np.ndarray) -> list[str | None]:
        return [self.graders[i] if i >= 0 else None for i in self.predict(Q)]


def format_guess(task_pool, prompt_embeddings) -> FormatGuess | None:
    """The answer-format guess of a router trained on `task_pool`: its in-distribution training rows' embeddings
    (`prompt_embeddings`: task_id, embedding) and graders; None when there is no such row."""
    pool = task_pool[["task_id", "grader", "split", "ood"]]
    train = pool[(pool["split"] == "train") & ~pool["ood"].astype(bool)].merge(prompt_embeddings, on="task_id")
    return FormatGuess(np.stack(train["embedding"].to_numpy()), train["grader"].tolist()) if len(train) else None
