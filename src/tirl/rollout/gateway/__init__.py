"""The policy behind an OpenAI-compatible endpoint, for agent programs a user brings (docs/agents.md).

`server.py` serves `/v1/chat/completions` and `/v1/completions` over the run's engine and records, per episode,
every completion's prompt ids, sampled ids and log-probs (`episode.Call`); `episode.py` builds trajectories from
those tokens, never from re-rendered text; `program.py` runs the user's agent program once per episode as the
rollout of `tirl rl` and `tirl eval` (`agent.program.command`).
"""
