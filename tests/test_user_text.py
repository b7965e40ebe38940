"""The text a router learns from and serve embeds: the question as a person types it (pipeline.core.prompts)."""
from __future__ import annotations

import pandas as pd
import pytest

from pipeline.core.paths import data_dir
from pipeline.core.prompts import math_prompt, mcq_prompt, routed_text, task_texts, user_text
from pipeline.tasks.sources import load_source


def test_a_pasted_zeroeval_template_gives_the_bare_question_on_every_bundled_prompt():
    t = pd.read_parquet(data_dir() / "sources" / "zeroeval" / "tasks.parquet")
    assert len(t) == 2840
    assert [user_text(p) for p in t["prompt"]] == [q.strip() for q in t["question"]]


@pytest.mark.parametrize("prompt, bare", [
    (math_prompt("What is 2 + 2?"), "What is 2 + 2?"),
    (mcq_prompt("Which is a prime?", ["4", "5"]), "Which is a prime?\n\nOptions:\nA. 4\nB. 5"),
    ("  plain question?  ", "plain question?"),
    ("Think step by step, then put the final answer in \\boxed{}.",  # a template alone is the user's text
     "Think step by step, then put the final answer in \\boxed{}."),
])
def test_user_text_strips_a_known_template_and_is_idempotent(prompt, bare):
    assert user_text(prompt) == bare
    assert user_text(user_text(prompt)) == bare


def test_a_template_inside_a_users_own_sentence_is_left_alone():
    wrapped = "Please help: " + math_prompt("What is 2 + 2?") + " thanks"
    assert user_text(wrapped) == wrapped.strip()


def test_routed_text_of_one_turn_is_its_user_text_and_a_conversation_needs_a_user_turn():
    assert routed_text([math_prompt("x?")]) == "x?"
    with pytest.raises(ValueError, match="user turn"):
        routed_text([])


def test_task_texts_read_the_user_text_and_fall_back_on_the_prompt():
    both = pd.DataFrame({"prompt": [math_prompt("a?")], "user_text": ["typed a?"]})
    assert task_texts(both) == ["typed a?"]
    assert task_texts(both.drop(columns="user_text")) == ["a?"]  # a user's own tasks file: the template stripped


@pytest.mark.parametrize("source", ["zeroeval_gsm8k", "zeroeval_crux", "mmlu_pro", "gsm8k"])
def test_every_task_carries_its_user_text_beside_the_prompt_agents_are_sent(source):
    tasks = load_source(source).head(50)
    assert (tasks["user_text"].str.len() > 0).all()
    assert (tasks["user_text"] != tasks["prompt"]).all()  # the answer-format instruction is the agents' alone
    assert [user_text(p) for p in tasks["prompt"]] == tasks["user_text"].tolist()
