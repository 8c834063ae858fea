"""Run verl 0.9.1's own algorithm functions on saved inputs (a subprocess of test_verl_parity.py).

verl's package __init__ pulls in Ray, vLLM glue and more; only `verl.trainer.ppo.core_algos` is needed, so the
package is imported as a bare namespace (its __init__ skipped). Usage: python verl_reference.py SITE IN.pt OUT.pt
"""

import sys
import types

site, src, dst = sys.argv[1:4]
sys.path.insert(0, site)
pkg = types.ModuleType("verl")
pkg.__path__ = [site + "/verl"]
sys.modules["verl"] = pkg

import numpy as np  # noqa: E402
import torch  # noqa: E402
import verl.trainer.ppo.core_algos as core  # noqa: E402
import verl.utils.torch_functional as verl_F  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

inp = torch.load(src)
out = {}
rewards, index, mask = inp["rewards"], np.array(inp["groups"]), inp["resp_mask"]
token_rewards = torch.zeros_like(mask, dtype=torch.float32)
token_rewards[:, -1] = rewards  # the outcome reward on the last response token, as verl places it
out["grpo"], _ = core.compute_grpo_outcome_advantage(token_rewards, mask, index)
out["drgrpo"], _ = core.compute_grpo_outcome_advantage(
    token_rewards, mask, index, norm_adv_by_std_in_grpo=False
)
out["rloo"], _ = core.compute_rloo_outcome_advantage(token_rewards, mask, index)

for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
    cfg = OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": inp["clip_low"],
            "clip_ratio_high": inp["clip_high"],
            "clip_ratio_c": inp["clip_c"],
            "global_batch_info": {"loss_scale_factor": inp["norm_len"]},
        }
    )
    logp = inp["logp"].clone().requires_grad_(True)
    loss, metrics = core.compute_policy_loss_vanilla(
        inp["old_logp"], logp, inp["adv"], inp["loss_mask"], agg, cfg
    )
    loss.backward()
    out[f"pg/{agg}"] = loss.detach()
    out[f"pg_grad/{agg}"] = logp.grad
    out[f"clipfrac/{agg}"] = torch.tensor(metrics["actor/pg_clipfrac"])
    for name, fn in (("gspo", core.compute_policy_loss_gspo), ("cispo", core.compute_policy_loss_cispo)):
        acfg = core.ActorConfig(
            strategy="fsdp",
            rollout_n=4,
            use_dynamic_bsz=True,
            clip_ratio_low=inp["clip_low"],
            clip_ratio_high=inp["clip_high"],
            clip_ratio_c=inp["clip_c"],
            global_batch_info={"loss_scale_factor": inp["norm_len"]},
        )
        logp = inp["logp"].clone().requires_grad_(True)
        loss, metrics = fn(inp["old_logp"], logp, inp["adv"], inp["loss_mask"], agg, acfg)
        loss.backward()
        out[f"{name}/{agg}"] = loss.detach()
        out[f"{name}_grad/{agg}"] = logp.grad
    out[f"agg/{agg}"] = core.agg_loss(inp["values"], inp["loss_mask"], agg, loss_scale_factor=inp["norm_len"])
for est in ("k1", "k3", "k2"):
    out[f"kl/{est}"] = core.kl_penalty(inp["logp"], inp["ref_logp"], est)
out["entropy"] = verl_F.entropy_from_logits(inp["logits"])
torch.save(out, dst)
