"""A transcription of verl's validation metrics (`verl/trainer/ppo/metric_utils.py`: `bootstrap_metric`,
`calc_maj_val`, the per-problem part of `process_validation_metrics`), the parity reference for
tirl.eval.verl_metrics. Test code only: it uses numpy's global legacy generator exactly as verl does, drawing one
index set per bootstrap iteration (the form of the Open-AgentRL fork).
"""

from collections import defaultdict
from functools import partial

import numpy as np


def bootstrap_metric(data, subset_size, reduce_fns, n_bootstrap=1000, seed=42):
    np.random.seed(seed)
    lists = [[] for _ in reduce_fns]
    for _ in range(n_bootstrap):
        idxs = np.random.choice(len(data), size=subset_size, replace=True)
        sample = [data[i] for i in idxs]
        for i, fn in enumerate(reduce_fns):
            lists[i].append(fn(sample))
    return [(np.mean(v), np.std(v)) for v in lists]


def calc_maj_val(data, vote_key, val_key):
    vote2vals = defaultdict(list)
    for d in data:
        vote2vals[d[vote_key]].append(d[val_key])
    vote2cnt = {k: len(v) for k, v in vote2vals.items()}
    maj_vote = max(vote2cnt, key=vote2cnt.get)
    return vote2vals[maj_vote][0]


def problem_metrics(acc, preds, seed=42):
    """One problem's `best@n/mean` and `maj@n/mean` at verl's n = 2, 4, ..., len(acc)."""
    n_resps = len(acc)
    ns, n = [], 2
    while n < n_resps:
        ns.append(n)
        n *= 2
    ns.append(n_resps)
    out = {}
    for n in ns:
        (best, _), _ = bootstrap_metric(acc, n, [np.max, np.min], seed=seed)
        out[f"best@{n}/mean"] = float(best)
        vote_data = [{"val": v, "pred": p} for v, p in zip(acc, preds)]
        [(maj, _)] = bootstrap_metric(
            vote_data, n, [partial(calc_maj_val, vote_key="pred", val_key="val")], seed=seed
        )
        out[f"maj@{n}/mean"] = float(maj)
    return out
