"""Pick-time cost: each agent's mean training cost vs a ridge prediction of its cost on the query (the cost scorer),
compared by the area under the validation λ path (AIQ over the agents' cost span); test printed for the record.

    python scripts/value_costs.py pipeline|routerbench
"""
import sys

sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
import numpy as np
from router_value import pipeline_data, routerbench_data

from pipeline.frontier import aiq, upper_hull
from pipeline.rewards import to_arrays
from pipeline.router import split_masks
from pipeline.train import TrainConfig, effective_rewards, ridge_path, train_head
from pipeline.value import agent_costs, fit_value_scorer

data = sys.argv[1]
X, rewards, split, _l, name = pipeline_data() if data == "pipeline" else routerbench_data()
agents, R, B, C = to_arrays(rewards)
m = split_masks(split.reset_index(drop=True), "test", rewards["task_id"].astype(str).tolist())
tr, va, te = m["train"], m["validation"], m["held_out"]
Re = effective_rewards(R, B)
head, _ = train_head(X[tr], R[tr], B[tr], X[va], R[va], B[va], TrainConfig(generations=0, log_every=0))
ridge, info = fit_value_scorer(head, X[tr], Re[tr], X[va], Re[va])
z = lambda A: (A - head.mean) / head.std
# cost predictor: ridge of per-query cost, alpha by val MSE
best=None
for a, th in ridge_path(z(X[tr]), C[tr], np.logspace(0,5,11)):
    p = z(X[va]) @ th[:-1] + th[-1]; mse = ((p - C[va])**2).mean()
    if best is None or mse < best[1]: best=(a,mse,th)
th = best[2]
cpred = lambda A: np.maximum(z(A) @ th[:-1] + th[-1], 1e-9)
cost = agent_costs(C[tr]); bs = int(np.argmax(Re[tr].mean(axis=0)))
print("cost ridge alpha", best[0], "val R2 per agent", 1 - ((cpred(X[va]) - C[va])**2).mean(0) / C[va].var(0))
def pick(pred, cmat, lam):
    v = pred - lam * cmat
    return v.argmax(1)
def path(pred, cmat, Rv, Cv):
    lams = np.concatenate([[0], np.geomspace(1e-2, 1e5, 150)])
    pts=[]
    for lam in lams:
        p = pick(pred, cmat, lam); pts.append((lam, *[1000*Cv[np.arange(len(p)),p].mean(), Rv[np.arange(len(p)),p].mean()], p))
    return pts
for nm, cm_va, cm_te in (("mean cost", np.tile(cost, (va.sum(),1)), np.tile(cost,(te.sum(),1))), ("predicted cost", cpred(X[va]), cpred(X[te]))):
    pv = path(ridge.scores(X[va]), cm_va, Re[va], C[va])
    pts = np.array([[c, q] for _, c, q, _ in pv])
    cmin, cmax = 1000*C[va].mean(0).min(), 1000*C[va].mean(0).max()
    print(nm, "val AIQ", round(aiq(upper_hull(pts), cmin, cmax), 4))
    qbs = Re[va][:, bs].mean(); cbs = 1000*C[te][:, bs].mean(); qte = Re[te][:, bs].mean()
    for f in (0.98, 0.95):
        ok = [i for i, (_, c, q, _) in enumerate(pv) if q >= f*qbs]
        i = min(ok, key=lambda i: pv[i][1]); lam = pv[i][0]
        p = pick(ridge.scores(X[te]), cm_te, lam)
        q = Re[te][np.arange(len(p)), p].mean(); c = 1000*C[te][np.arange(len(p)), p].mean()
        print(f"  quality>={f}: val q {pv[i][2]:.4f} cost {pv[i][1]:.3f} | test q {q:.4f} ({q/qte:.3f}) cost ratio {c/cbs:.3f}")
