"""One reply judged: the judge agent's calls through the pool's client (pipeline/collect/client.py), read as
pipeline/collect/judge.py says. Apart from judge.py, which the replay judge reads too, so no import runs in a circle
(client -> replay -> judge)."""
from __future__ import annotations

from pipeline.collect.client import call_once
from pipeline.collect.judge import (
    JudgeSettings,
    addresses_judge,
    judge_call_settings,
    judge_prompts,
    orders,
    read_verdict,
    tie_fields,
    unjudgeable_fields,
)


async def judge_reply(client, judge, js: JudgeSettings, settings, task_id: str, agent: str, instruction: str,
                      replies: tuple[str, str | None]) -> dict:
    """The judge fields of one reply (pipeline/collect/judge.py): the reward, its state, and what the judge calls
    cost; `replies`: (the reply, the reference reply it is compared with, None when there is none)."""
    reply, reference = replies
    if reference is None:
        return unjudgeable_fields(js, "no reference reply (the reference agent's call failed or was not made)")
    if reply == reference:
        return tie_fields(js)
    flags = ["addresses_judge"] if addresses_judge(reply) else []
    call_settings = judge_call_settings(js, settings)
    extra = {"logprobs": True, "top_logprobs": js.top_logprobs} if js.top_logprobs else {}
    firsts = orders(js, task_id, agent)
    ps, reads, cost, pt, ct = [], [], 0.0, 0, 0
    for first, prompt in zip(firsts, judge_prompts(js, task_id, agent, instruction, reply, reference)):
        f = await call_once(client, judge, prompt, call_settings, extra)
        cost += float(f["cost_usd"] or 0.0)
        pt, ct = pt + int(f["prompt_tokens"] or 0), ct + int(f["completion_tokens"] or 0)
        spent = {"judge_calls": len(ps) + 1, "judge_cost_usd": cost, "judge_prompt_tokens": pt,
                 "judge_completion_tokens": ct, "judge_orders": ["reply_A" if x else "reply_B" for x in firsts]}
        if f["status"] == "error":
            return unjudgeable_fields(js, f"judge call failed: {f['error_kind']}", flags, **spent)
        p_a, how = read_verdict(f["response_text"], f.get("logprobs"))
        if p_a is None:
            return unjudgeable_fields(js, f"verdict {how}: {str(f['response_text'] or '')[:80]!r}", flags, **spent)
        ps.append(p_a if first else 1.0 - p_a)
        reads.append(how)
    return {"reward": sum(ps) / len(ps), "judge_state": "judged", "judge_reason": "", "judge_model": js.model,
            "judge_p": ps, "judge_read": reads, "judge_flags": flags, **spent}
